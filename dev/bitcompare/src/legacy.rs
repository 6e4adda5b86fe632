//! The original calls of the typed API (the 544 lines after `isa`), kept exactly as they
//! print so that revisions before the run-time layer stay comparable.
use mha::*;

use crate::{hash, Rng};

fn mat<const R: usize, const C: usize>(rng: &mut Rng, s: f32) -> Matrix<R, C> {
    Matrix::from_fn(|_, _| rng.f() * s)
}
fn ten<const B: usize, const T: usize, const D: usize>(rng: &mut Rng) -> Tensor<B, T, D> {
    Tensor::from_fn(|_, _, _| rng.f())
}

fn biases<const D: usize, const KV: usize>(rng: &mut Rng) -> MhaBiases<D, KV> {
    MhaBiases {
        bq: Some(mat(rng, 0.1)),
        bk: Some(mat(rng, 0.1)),
        bv: Some(mat(rng, 0.1)),
        bo: Some(mat(rng, 0.1)),
    }
}

fn selfcase<const B: usize, const T: usize, const D: usize, const KV: usize>(
    name: &str,
    h: usize,
    seed: u64,
) {
    let mut rng = Rng(seed);
    let p = MhaParams::<D, D, KV>::from_parts(
        mat(&mut rng, 0.3),
        mat(&mut rng, 0.3),
        mat(&mut rng, 0.3),
        mat(&mut rng, 0.3),
    );
    let b = biases::<D, KV>(&mut rng);
    let x: Tensor<B, T, D> = ten(&mut rng);
    let lens: Vec<usize> = (0..B).map(|i| (T * (i + 1) / (B + 1)).max(1)).collect();
    let pad: Vec<bool> = (0..B * T).map(|i| (i * 7 + 3) % 5 != 0).collect();
    let bmask: Vec<bool> = (0..T * T).map(|i| (i * 11 + 1) % 4 != 0).collect();
    let amask: Vec<f32> = (0..B * T * T)
        .map(|i| {
            if i % 6 == 0 {
                f32::NEG_INFINITY
            } else {
                rng.f()
            }
        })
        .collect();
    for masking in [Masking::Causal, Masking::Bidirectional] {
        for threads in [1, 2, 3] {
            for with_bias in [false, true] {
                let mut builder = Mha::builder(&p, h)
                    .masking(masking)
                    .threads(threads)
                    .min_work_per_thread(0);
                if with_bias {
                    builder = builder.biases(b.clone());
                }
                let mut layer = builder.build().unwrap();
                let tag = format!("{name} {masking:?} t{threads} bias{with_bias}");
                // forward_into, not forward: the same call in every revision's API.
                let mut y = x.clone();
                layer
                    .forward_into(&x, AttendOptions::default(), &mut y)
                    .unwrap();
                println!("{tag} forward {:016x}", hash(y.as_slice()));
                let opts: [(&str, AttendOptions); 4] = [
                    (
                        "lens",
                        AttendOptions {
                            key_lengths: Some(&lens),
                            ..Default::default()
                        },
                    ),
                    (
                        "pad",
                        AttendOptions {
                            key_padding_mask: Some(&pad),
                            ..Default::default()
                        },
                    ),
                    (
                        "bmask",
                        AttendOptions {
                            mask: Some(AttnMask::Bool(&bmask)),
                            ..Default::default()
                        },
                    ),
                    (
                        "amask",
                        AttendOptions {
                            mask: Some(AttnMask::Additive(&amask)),
                            key_lengths: Some(&lens),
                            ..Default::default()
                        },
                    ),
                ];
                for (oname, o) in opts {
                    let mut w = AttentionWeights::new();
                    let mut y = Tensor::<B, T, D>::zeros();
                    layer
                        .forward_into(&x, o, Output::from(&mut y).with_weights(&mut w))
                        .unwrap();
                    println!(
                        "{tag} {oname} {:016x} w {:016x}",
                        hash(y.as_slice()),
                        hash(w.as_slice())
                    );
                }
                if masking == Masking::Causal {
                    // decode token by token and by chunks of 3 (T must be a multiple of 3 for chunks: dump what fits)
                    let mut cache = layer.new_cache(B, T + 5).unwrap();
                    let mut all = Vec::new();
                    for t in 0..T {
                        let tok = Tensor::<B, 1, D>::from_fn(|bb, _, i| x[(bb, t, i)]);
                        let mut out = Tensor::<B, 1, D>::zeros();
                        layer
                            .decode_into(&tok, &mut cache, AttendOptions::default(), &mut out)
                            .unwrap();
                        all.extend_from_slice(out.as_slice());
                    }
                    println!("{tag} decode1 {:016x}", hash(&all));
                    let mut cache = layer.new_cache(B, T + 5).unwrap();
                    let mut all = Vec::new();
                    for t0 in (0..T - T % 3).step_by(3) {
                        let tok = Tensor::<B, 3, D>::from_fn(|bb, tt, i| x[(bb, t0 + tt, i)]);
                        let mut out = Tensor::<B, 3, D>::zeros();
                        layer
                            .decode_into(&tok, &mut cache, AttendOptions::default(), &mut out)
                            .unwrap();
                        all.extend_from_slice(out.as_slice());
                    }
                    println!("{tag} decode3 {:016x}", hash(&all));
                }
            }
        }
    }
}

fn crosscase<
    const B: usize,
    const T: usize,
    const D: usize,
    const S: usize,
    const E: usize,
    const KV: usize,
>(
    name: &str,
    h: usize,
    seed: u64,
) {
    let mut rng = Rng(seed);
    let p = MhaParams::<D, E, KV>::from_parts(
        mat(&mut rng, 0.3),
        mat(&mut rng, 0.3),
        mat(&mut rng, 0.3),
        mat(&mut rng, 0.3),
    );
    let b = biases::<D, KV>(&mut rng);
    let x: Tensor<B, T, D> = ten(&mut rng);
    let m: Tensor<B, S, E> = ten(&mut rng);
    let lens: Vec<usize> = (0..B).map(|i| (S * (i + 1) / (B + 1)).max(1)).collect();
    let amask: Vec<f32> = (0..T * S)
        .map(|i| {
            if i % 5 == 0 {
                f32::NEG_INFINITY
            } else {
                rng.f()
            }
        })
        .collect();
    for masking in [Masking::Causal, Masking::Bidirectional] {
        for threads in [1, 2, 3] {
            let mut layer = Mha::builder(&p, h)
                .masking(masking)
                .threads(threads)
                .min_work_per_thread(0)
                .biases(b.clone())
                .build()
                .unwrap();
            let tag = format!("{name} {masking:?} t{threads}");
            let mut y = Tensor::<B, T, D>::zeros();
            layer
                .cross_into(&x, &m, AttendOptions::default(), &mut y)
                .unwrap();
            println!("{tag} cross {:016x}", hash(y.as_slice()));
            let mut w = AttentionWeights::new();
            let o = AttendOptions {
                key_lengths: Some(&lens),
                mask: Some(AttnMask::Additive(&amask)),
                ..Default::default()
            };
            layer
                .cross_into(&x, &m, o, Output::from(&mut y).with_weights(&mut w))
                .unwrap();
            println!(
                "{tag} cross-opts {:016x} w {:016x}",
                hash(y.as_slice()),
                hash(w.as_slice())
            );
        }
    }
}

fn attncase<const B: usize, const T: usize, const D: usize>(name: &str, h: usize, seed: u64) {
    let mut rng = Rng(seed);
    let q = split_heads(&ten::<B, T, D>(&mut rng), h).unwrap();
    let k = split_heads(&ten::<B, T, D>(&mut rng), h).unwrap();
    let v = split_heads(&ten::<B, T, D>(&mut rng), h).unwrap();
    let out = attention(&q, &k, &v, &causal_mask(T).unwrap()).unwrap();
    println!("{name} attention {:016x}", hash(out.as_slice()));
    let mut rng = Rng(seed + 1);
    let x: Tensor<B, T, D> = ten(&mut rng);
    let p = MhaParams::new(
        mat(&mut rng, 0.3),
        mat(&mut rng, 0.3),
        mat(&mut rng, 0.3),
        mat(&mut rng, 0.3),
    );
    println!(
        "{name} mha_forward {:016x}",
        hash(mha_forward(&x, &p, h).unwrap().as_slice())
    );
}

/// Prints the original 544 lines.
pub fn run() {
    selfcase::<2, 37, 24, 24>("a", 3, 1);
    selfcase::<1, 200, 64, 64>("b", 4, 2);
    selfcase::<3, 5, 12, 12>("c", 2, 3);
    selfcase::<1, 1, 8, 8>("d", 1, 4);
    selfcase::<2, 97, 40, 40>("e", 5, 5);
    selfcase::<2, 50, 32, 16>("gqa", 4, 6);
    selfcase::<1, 130, 48, 12>("mqa", 4, 7);
    crosscase::<2, 19, 16, 23, 12, 16>("x1", 4, 8);
    crosscase::<1, 100, 32, 130, 32, 16>("x2", 4, 9);
    crosscase::<2, 7, 24, 3, 20, 24>("x3", 3, 10);
    attncase::<2, 37, 24>("at1", 3, 11);
    attncase::<1, 130, 64>("at2", 4, 12);
}
