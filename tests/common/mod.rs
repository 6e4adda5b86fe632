//! Shared test helpers: an independent plain-loop reference in f64 and a seeded PRNG.
#![allow(dead_code)]

/// A small deterministic PRNG (SplitMix64), so tests need no dependency for data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * scale).collect()
    }
}

/// Row-major (m, k) · (k, n) in f64.
pub fn matmul(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            for j in 0..n {
                c[i * n + j] += a[i * k + p] * b[p * n + j];
            }
        }
    }
    c
}

/// Causal multi-head self-attention, written independently of the crate: per batch element,
/// per head, per query, plain loops, f64 throughout. `x` is (b, t, dm) row-major; weights are
/// (dm, dm) row-major in the x @ W convention.
#[allow(clippy::too_many_arguments)]
pub fn reference_mha(
    x: &[f32],
    wq: &[f32],
    wk: &[f32],
    wv: &[f32],
    wo: &[f32],
    b: usize,
    t: usize,
    dm: usize,
    h: usize,
) -> Vec<f64> {
    let f = |v: &[f32]| v.iter().map(|&e| e as f64).collect::<Vec<f64>>();
    let x = f(x);
    let (wq, wk, wv, wo) = (f(wq), f(wk), f(wv), f(wo));
    let rows = b * t;
    let q = matmul(&x, &wq, rows, dm, dm);
    let k = matmul(&x, &wk, rows, dm, dm);
    let v = matmul(&x, &wv, rows, dm, dm);
    let d = dm / h;
    let mut merged = vec![0.0; rows * dm];
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..t {
                let qi = &q[(bi * t + i) * dm + hi * d..][..d];
                let mut scores = Vec::with_capacity(i + 1);
                for j in 0..=i {
                    let kj = &k[(bi * t + j) * dm + hi * d..][..d];
                    let dot: f64 = qi.iter().zip(kj).map(|(a, b)| a * b).sum();
                    scores.push(dot / (d as f64).sqrt());
                }
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = weights.iter().sum();
                for (j, w) in weights.iter().enumerate() {
                    let vj = &v[(bi * t + j) * dm + hi * d..][..d];
                    for c in 0..d {
                        merged[(bi * t + i) * dm + hi * d + c] += w / total * vj[c];
                    }
                }
            }
        }
    }
    matmul(&merged, &wo, rows, dm, dm)
}

/// Asserts |got - want| <= abs + rel * |want| elementwise, naming the first failure.
pub fn assert_close(got: &[f32], want: &[f64], abs: f64, rel: f64, context: &str) {
    assert_eq!(got.len(), want.len(), "{context}: length");
    for (index, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs();
        assert!(
            err <= abs + rel * w.abs(),
            "{context}: element {index}: got {g}, want {w}, error {err:e}"
        );
    }
}

/// Widens an `f32` buffer to `f64`.
pub fn widen(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&e| e as f64).collect()
}

/// Narrows an `f64` buffer to `f32` (round to nearest).
pub fn narrow(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&e| e as f32).collect()
}

/// Masked scaled dot-product attention over heads, written independently of the crate: `q`,
/// `k`, `v` are `(b, h, t, d)` row-major; key `j` takes part in query `i`'s softmax only when
/// `mask[i * t + j]`; a query that sees no key gets zeros. f64 throughout. Returns `(b, h, t, d)`.
#[allow(clippy::too_many_arguments)]
pub fn reference_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: &[bool],
    b: usize,
    h: usize,
    t: usize,
    d: usize,
) -> Vec<f64> {
    let (q, k, v) = (widen(q), widen(k), widen(v));
    let mut out = vec![0.0; b * h * t * d];
    let scale = 1.0 / (d as f64).sqrt();
    for head in 0..b * h {
        let base = head * t * d;
        for i in 0..t {
            let visible: Vec<usize> = (0..t).filter(|&j| mask[i * t + j]).collect();
            if visible.is_empty() {
                continue;
            }
            let scores: Vec<f64> = visible
                .iter()
                .map(|&j| {
                    (0..d)
                        .map(|c| q[base + i * d + c] * k[base + j * d + c])
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for (&j, w) in visible.iter().zip(&weights) {
                for c in 0..d {
                    out[base + i * d + c] += w / total * v[base + j * d + c];
                }
            }
        }
    }
    out
}

/// Weights of an `(dm, dm)` projection: uniform with variance `1 / dm` (like N(0, 1/dm)).
pub fn weights(rng: &mut Rng, dm: usize) -> Vec<f32> {
    rng.vec(dm * dm, (3.0 / dm as f32).sqrt())
}

/// Asserts that two buffers hold the same bits, naming the first difference.
pub fn assert_bits_eq(got: &[f32], want: &[f32], context: &str) {
    assert_eq!(got.len(), want.len(), "{context}: length");
    for (index, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            g.to_bits(),
            w.to_bits(),
            "{context}: element {index}: got {g:?}, want {w:?}"
        );
    }
}
