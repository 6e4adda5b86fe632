//! The command-line pieces the `bench` and `model` examples share: a count, a thread count, a
//! key/value or weight format or an arithmetic by name, what `main` does with the parsed options, and the
//! threads the process runs.

use mha::{Compute, KvFormat, ThreadPool, WeightFormat};

/// `value`, the argument of `option`, as a count.
pub fn count(option: &str, value: &str) -> Result<usize, String> {
    value
        .parse()
        .map_err(|_| format!("{option}: {value:?} is not a count"))
}

/// `value`, the argument of `option`, as a count of at least 1.
pub fn positive(option: &str, value: &str) -> Result<usize, String> {
    match count(option, value)? {
        0 => Err(format!("{option} must be at least 1, got 0")),
        n => Ok(n),
    }
}

/// `value`, the argument of `option`, as a thread count: 0 means every CPU the process may use
/// (as for `ThreadPool::new(0)`), and a count the crate would lower (more than 256, the most a
/// layer uses) is an error rather than a silent clamp.
pub fn threads(option: &str, value: &str) -> Result<usize, String> {
    let asked = count(option, value)?;
    // `ThreadPool::new` resolves 0 and caps the count; it starts no thread.
    let threads = ThreadPool::new(asked).threads();
    if asked != 0 && threads != asked {
        return Err(format!(
            "{option}: {asked} threads is more than {threads}, the most a layer uses"
        ));
    }
    Ok(threads)
}

/// The key/value format named `name` (`f32`, `bf16`, `f16`, `q8_0`), the argument of `option`.
pub fn kv_format(option: &str, name: &str) -> Result<KvFormat, String> {
    let known = KvFormat::ALL.into_iter().find(|f| f.name() == name);
    known.ok_or_else(|| format!("{option}: {name:?} is none of f32, bf16, f16, q8_0"))
}

/// The weight format named `name` (one of [`WeightFormat::ALL`]'s names), the argument of
/// `option`.
pub fn weight_format(option: &str, name: &str) -> Result<WeightFormat, String> {
    let known = WeightFormat::ALL.into_iter().find(|f| f.name() == name);
    known.ok_or_else(|| {
        let names: Vec<&str> = WeightFormat::ALL.iter().map(|f| f.name()).collect();
        format!("{option}: {name:?} is none of {}", names.join(", "))
    })
}

/// The arithmetic named `name` (`f32`, `int8` or `bf16`), or an error naming `option` and the
/// choices.
pub fn compute(option: &str, name: &str) -> Result<Compute, String> {
    let known = Compute::ALL.into_iter().find(|c| c.name() == name);
    known.ok_or_else(|| format!("{option}: {name:?} is none of f32, int8, bf16"))
}

/// The options `parsed` holds. For `--help` (`Ok(None)`) it prints `usage` and exits with 0,
/// and for a bad argument it prints the error and the first line of `usage` and exits with 2.
pub fn options_or_exit<T>(parsed: Result<Option<T>, String>, usage: &str) -> T {
    match parsed {
        Ok(Some(options)) => options,
        Ok(None) => {
            println!("{usage}");
            std::process::exit(0)
        }
        Err(e) => {
            let synopsis = usage.lines().next().unwrap_or(usage);
            eprintln!("error: {e}\n{synopsis}   (--help lists the options and their defaults)");
            std::process::exit(2)
        }
    }
}

/// The threads of this process (`/proc/self/task`, Linux), if readable.
pub fn process_threads() -> Option<usize> {
    Some(std::fs::read_dir("/proc/self/task").ok()?.count())
}
