//! The command-line pieces the `bench` and `model` examples share: a count, a key/value or
//! weight format by name, and what `main` does with the parsed options.

use mha::{KvFormat, WeightFormat};

/// `value`, the argument of `option`, as a count.
pub fn count(option: &str, value: &str) -> Result<usize, String> {
    value
        .parse()
        .map_err(|_| format!("{option}: {value:?} is not a count"))
}

/// The key/value format named `name` (`f32`, `bf16`, `f16`, `q8_0`), the argument of `option`.
pub fn kv_format(option: &str, name: &str) -> Result<KvFormat, String> {
    let known = KvFormat::ALL.into_iter().find(|f| f.name() == name);
    known.ok_or_else(|| format!("{option}: {name:?} is none of f32, bf16, f16, q8_0"))
}

/// The weight format named `name` (`f32`, `bf16`, `f16`), the argument of `option`.
pub fn weight_format(option: &str, name: &str) -> Result<WeightFormat, String> {
    let known = WeightFormat::ALL.into_iter().find(|f| f.name() == name);
    known.ok_or_else(|| format!("{option}: {name:?} is none of f32, bf16, f16"))
}

/// The options `parsed` holds. For `--help` (`Ok(None)`) it prints `usage` and exits with 0,
/// and for a bad argument it prints the error and `usage` and exits with 2.
pub fn options_or_exit<T>(parsed: Result<Option<T>, String>, usage: &str) -> T {
    match parsed {
        Ok(Some(options)) => options,
        Ok(None) => {
            println!("{usage}");
            std::process::exit(0)
        }
        Err(e) => {
            eprintln!("error: {e}\n{usage}");
            std::process::exit(2)
        }
    }
}
