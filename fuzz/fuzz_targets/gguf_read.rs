//! Any bytes through `Gguf::parse`; a file that parses has every tensor's values read (each
//! read gives exactly the values its dimensions count, or an error with a message) and the
//! attention config of its first layer asked for: errors only, never a panic or a huge
//! allocation.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mha::gguf::Gguf;
use mha::AttentionConfig;

fuzz_target!(|data: &[u8]| {
    let gguf = match Gguf::parse(data) {
        Ok(gguf) => gguf,
        Err(e) => return assert!(!e.to_string().is_empty()),
    };
    for t in gguf.tensors() {
        let range = gguf.range(t);
        assert!(range.start >= gguf.data_start() && range.end <= data.len() as u64);
        match gguf.tensor_f32(data, &t.name) {
            Ok(values) => assert_eq!(values.len() as u64, t.len()),
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
    if let Err(e) = AttentionConfig::from_gguf(&gguf, 0) {
        assert!(!e.to_string().is_empty());
    }
});
