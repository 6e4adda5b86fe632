//! Any bytes through `SafeTensors::parse`; a file that parses goes through every accessor,
//! each checked against the raw bytes (see `mha_fuzz::check_accessors`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use mha::safetensors::SafeTensors;

fuzz_target!(|data: &[u8]| {
    match SafeTensors::parse(data) {
        Ok(st) => mha_fuzz::check_accessors(&st, data),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
