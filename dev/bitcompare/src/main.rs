//! Prints a hash of the output bits of many calls, one line per call (see run.sh): first the
//! original calls of the typed API (`legacy`, unchanged, so that older revisions stay
//! comparable), then the run-time `Layer` with every setting, option, cache and weight format
//! (`cases`), layers loaded from checkpoints of every family (`checkpoint`), and the public
//! kernels and functions (`kernels`).
mod calls;
mod cases;
mod checkpoint;
mod kernels;
mod layer;
mod legacy;

use mha::{AttentionWeights, Isa};

/// Deterministic inputs (splitmix64), uniform in [-1, 1).
pub struct Rng(pub u64);
impl Rng {
    pub fn f(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// `n` values uniform in [-scale, scale).
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f() * scale).collect()
    }
}

/// FNV-1a of `bytes`.
pub fn fnv(bytes: impl IntoIterator<Item = u8>) -> u64 {
    let mut h = 0xcbf29ce484222325u64;
    for b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// A seed of its own for each case name, so that adding a case changes no other's inputs.
pub fn seed_of(name: &str) -> u64 {
    fnv(name.bytes())
}

/// The hash of the bits of `v`.
pub fn hash(v: &[f32]) -> u64 {
    fnv(v.iter().flat_map(|x| x.to_bits().to_le_bytes()))
}

/// The hash of the bits of `v`.
pub fn hash64(v: &[f64]) -> u64 {
    fnv(v.iter().flat_map(|x| x.to_bits().to_le_bytes()))
}

/// Prints `tag` and the hash of `v`.
pub fn show(tag: &str, v: &[f32]) {
    println!("{tag} {:016x}", hash(v));
}

/// The shape and the hashes of attention weights and of their mean over heads.
pub fn weights_hash(w: &AttentionWeights) -> String {
    let (shape, mean) = (w.shape(), hash(&w.mean_over_heads()));
    format!("w{shape:?} {:016x} mean {mean:016x}", hash(w.as_slice()))
}

fn main() {
    println!("isa {:?}", Isa::detect());
    legacy::run();
    cases::run();
    checkpoint::run();
    kernels::run();
}
