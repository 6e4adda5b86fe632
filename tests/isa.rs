//! `MHA_ISA`: a forced table takes, and a name that cannot be honoured is reported, not ignored.

use mha::{Isa, ShapeError};

/// The suite runs once per table (`.ci/run`): when `MHA_ISA` is set, the table it names is the
/// one every other test in this run used, or this test fails. Without feature `std` the crate
/// reads no environment: the widest table runs.
#[test]
fn the_table_that_runs_is_the_one_requested() {
    match std::env::var("MHA_ISA")
        .ok()
        .filter(|_| cfg!(feature = "std"))
    {
        Some(name) => {
            let requested = Isa::from_env().unwrap_or_else(|e| panic!("MHA_ISA={name}: {e}"));
            assert_eq!(requested, Some(Isa::detect()), "MHA_ISA={name}");
            assert!(Isa::detect().name().eq_ignore_ascii_case(name.trim()));
        }
        None => {
            let widest = Isa::ALL.into_iter().rev().find(|isa| isa.is_supported());
            assert_eq!(Some(Isa::detect()), widest);
        }
    }
}

#[test]
fn names_are_parsed_and_unknown_ones_are_errors() {
    assert_eq!(Isa::from_name("portable"), Ok(Isa::Portable));
    assert_eq!(Isa::from_name(" PORTABLE\n"), Ok(Isa::Portable));
    for isa in Isa::ALL {
        let parsed = Isa::from_name(isa.name());
        if isa.is_supported() {
            assert_eq!(parsed, Ok(isa));
        } else {
            assert_eq!(parsed, Err(ShapeError::UnsupportedIsa { isa: isa.name() }));
        }
    }
    for bad in ["avx", "", "avx-512", "sse2", "neon?"] {
        let message = Isa::from_name(bad).unwrap_err().to_string();
        assert_eq!(
            message,
            format!("MHA_ISA is {bad:?}, but must be one of portable, avx2, avx512, neon")
        );
    }
}

/// Runs this test binary again with `MHA_ISA=avx` and only the test below, and reads its
/// standard error: the unknown name must be reported there (with feature `std`; without it
/// the crate reads no environment).
#[test]
#[cfg(feature = "std")]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "re-runs the test binary, which a cross runner such as qemu-user cannot exec"
)]
fn an_unknown_name_is_reported_on_standard_error() {
    if std::env::var_os("MHA_ISA_CHILD").is_some() {
        return;
    }
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_detects_once",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("MHA_ISA", "avx")
        .env("MHA_ISA_CHILD", "1")
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let widest = Isa::ALL.into_iter().rev().find(|isa| isa.is_supported());
    let expected = format!(
        "mha: MHA_ISA is \"avx\", but must be one of portable, avx2, avx512, neon; using {}",
        widest.unwrap().name()
    );
    assert_eq!(stderr.matches(&expected).count(), 1, "stderr: {stderr}");
}

/// The child's side of the test above: detects twice (the report is written once).
#[test]
#[cfg(feature = "std")]
fn child_detects_once() {
    if std::env::var_os("MHA_ISA_CHILD").is_none() {
        return;
    }
    assert_eq!(Isa::detect(), Isa::detect());
    assert!(Isa::from_env().is_err());
}
