//! Rotary position embeddings: the frequencies of every scaling against `transformers`'
//! formulas (written again here in plain f64, and anchored on values `transformers` printed),
//! the angles (`RopeAngles`) and the in-place rotation against plain f64 loops on odd shapes
//! (both layouts, partial rotary), whole layers with RoPE against the f64 attention oracle
//! with rotated queries and keys, bit-exact decoding properties (quickcheck), a rolling cache
//! decoding 100,000 tokens, and the errors.

mod common;
#[path = "common/counting_alloc.rs"]
mod counting_alloc;

use common::modes::{check_all, configs, output, Weights, ABS, REL};
use common::{assert_bits_eq, assert_close, RefRope, Rng};
use mha::{AttendOptions, Isa, KvCache, Masking, Mha, Output, ShapeError, Tensor, Tokens};
use mha::{Rope, RopeAngles, RopeLayout, RopePositions, RopeRows, RopeScaling};
use quickcheck::{QuickCheck, TestResult};

use core::f64::consts::PI;

// ---------------------------------------------------------------------------------------------
// The reference: transformers' `modeling_rope_utils.py`, in f64 with std's functions.

/// `_compute_*_parameters`: the inverse frequencies of `rope`.
fn hf_inv_freq(rope: &Rope) -> Vec<f64> {
    let (dim, base) = (rope.rotary_dim as f64, rope.theta);
    // pos_freqs = base ** (arange(0, dim, 2) / dim)
    let pos_freqs: Vec<f64> = (0..rope.rotary_dim)
        .step_by(2)
        .map(|i| base.powf(i as f64 / dim))
        .collect();
    match rope.scaling {
        RopeScaling::Default => pos_freqs.iter().map(|p| 1.0 / p).collect(),
        RopeScaling::Linear { factor } => pos_freqs.iter().map(|p| 1.0 / p / factor).collect(),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings: old_context_len,
        } => {
            let low_freq_wavelen = old_context_len / low_freq_factor;
            let high_freq_wavelen = old_context_len / high_freq_factor;
            let llama = |inv_freq: f64| {
                let wavelen = 2.0 * PI / inv_freq;
                let inv_freq_llama = if wavelen > low_freq_wavelen {
                    inv_freq / factor
                } else {
                    inv_freq
                };
                let smooth_factor = (old_context_len / wavelen - low_freq_factor)
                    / (high_freq_factor - low_freq_factor);
                let smoothed = (1.0 - smooth_factor) * inv_freq_llama / factor
                    + smooth_factor * inv_freq_llama;
                let is_medium = wavelen >= high_freq_wavelen && wavelen <= low_freq_wavelen;
                if is_medium {
                    smoothed
                } else {
                    inv_freq_llama
                }
            };
            pos_freqs.iter().map(|p| llama(1.0 / p)).collect()
        }
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings: max_pos,
            beta_fast,
            beta_slow,
            truncate,
            ..
        } => {
            let find_correction_dim =
                |rot: f64| (dim * (max_pos / (rot * 2.0 * PI)).ln()) / (2.0 * base.ln());
            let (mut low, mut high) = (
                find_correction_dim(beta_fast),
                find_correction_dim(beta_slow),
            );
            if truncate {
                (low, high) = (low.floor(), high.ceil());
            }
            let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
            if low == high {
                high += 0.001;
            }
            pos_freqs
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                    let extrapolation_factor = 1.0 - ramp;
                    let (extrapolation, interpolation) = (1.0 / p, 1.0 / (factor * p));
                    interpolation * (1.0 - extrapolation_factor)
                        + extrapolation * extrapolation_factor
                })
                .collect()
        }
        // `_compute_proportional_rope_parameters`: the first `pairs` as defined, the rest 0.
        RopeScaling::Proportional { pairs, factor } => (pos_freqs.iter().enumerate())
            .map(|(i, p)| if i < pairs { 1.0 / p / factor } else { 0.0 })
            .collect(),
    }
}

/// The reference rotation of `rope` at the given positions.
fn ref_rope<'a>(rope: &Rope, inv: &'a [f64], positions: Option<&'a [usize]>) -> RefRope<'a> {
    RefRope {
        rotary_dim: rope.rotary_dim,
        interleaved: rope.layout == RopeLayout::Interleaved,
        inv_freq: inv,
        attention_factor: rope.scaling.attention_factor(),
        positions,
    }
}

fn rope(theta: f64, rotary_dim: usize, layout: RopeLayout, scaling: RopeScaling) -> Rope {
    Rope {
        theta,
        rotary_dim,
        layout,
        scaling,
    }
}

const LLAMA3: RopeScaling = RopeScaling::Llama3 {
    factor: 8.0,
    low_freq_factor: 1.0,
    high_freq_factor: 4.0,
    original_max_position_embeddings: 64.0,
};

/// YaRN with a short original context, so that small heads cross the blend.
fn yarn(factor: f64, truncate: bool) -> RopeScaling {
    RopeScaling::Yarn {
        factor,
        original_max_position_embeddings: 64.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attention_factor: RopeScaling::yarn_attention_factor(factor, None, None),
        truncate,
    }
}

/// Every scaling, with settings that reach each branch of its formula at small head widths.
fn scalings() -> Vec<RopeScaling> {
    vec![
        RopeScaling::Default,
        RopeScaling::Linear { factor: 2.5 },
        LLAMA3,
        yarn(4.0, true),
        yarn(3.0, false),
    ]
}

// ---------------------------------------------------------------------------------------------
// Frequencies

#[test]
fn inverse_frequencies_follow_transformers_formulas() {
    for scaling in scalings() {
        for theta in [10_000.0, 500_000.0, 1e6, 3.0] {
            for rotary_dim in [0, 2, 4, 6, 8, 10, 12, 18, 64, 128] {
                let r = rope(theta, rotary_dim, RopeLayout::RotateHalf, scaling);
                let got = r.inverse_frequencies().unwrap();
                let want = hf_inv_freq(&r);
                assert_eq!(got.len(), rotary_dim / 2);
                assert_close_f64(&got, &want, 1e-13, &format!("{r:?}"));
            }
        }
    }
}

/// `transformers` 5.23's own functions (float32 internally), printed for these configs.
#[test]
fn inverse_frequencies_match_values_transformers_printed() {
    let llama = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8192.0,
    };
    let got = printed_inv_freq(500_000.0, 128, llama);
    let want: [(usize, f64); 8] = [
        (0, 1.0),
        (1, 0.8146172165870667),
        (28, 0.0032114461064338684),
        (29, 0.0021665706299245358),
        (33, 0.0003126936499029398),
        (35, 9.556212171446532e-05),
        (36, 7.784655463183299e-05),
        (63, 3.068925877869333e-07),
    ];
    assert_close_at(&got, &want, 2e-6, "llama3");
    let yarn_4 = RopeScaling::Yarn {
        factor: 4.0,
        original_max_position_embeddings: 2048.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attention_factor: RopeScaling::yarn_attention_factor(4.0, None, None),
        truncate: true,
    };
    assert!((yarn_4.attention_factor() - 1.138629436111989).abs() < 1e-15);
    let got = printed_inv_freq(10_000.0, 64, yarn_4);
    let want: [(usize, f64); 6] = [
        (8, 0.10000000149011612),
        (9, 0.07066310197114944),
        (10, 0.049745574593544006),
        (20, 0.0009730085730552673),
        (22, 0.00044456985779106617),
        (31, 3.333803761051968e-05),
    ];
    assert_close_at(&got, &want, 2e-6, "yarn");
    let yarn_nt = RopeScaling::Yarn {
        factor: 3.0,
        original_max_position_embeddings: 4096.0,
        beta_fast: 16.0,
        beta_slow: 2.0,
        attention_factor: RopeScaling::yarn_attention_factor(3.0, None, None),
        truncate: false,
    };
    assert!((yarn_nt.attention_factor() - 1.109861228866811).abs() < 1e-15);
    let got = printed_inv_freq(1e6, 18, yarn_nt);
    let want = [
        1.0,
        0.2154434770345688,
        0.04641588777303696,
        0.007121438160538673,
        0.0007181448745541275,
        0.000154719571582973,
        3.3333326427964494e-05,
        7.181447926996043e-06,
        1.54719623424171e-06,
    ];
    assert_close_f64(&got, &want, 2e-6, "yarn without truncate");
    let linear = RopeScaling::Linear { factor: 2.5 };
    let got = printed_inv_freq(10_000.0, 10, linear);
    let want = [
        0.4000000059604645,
        0.06339572370052338,
        0.010047545656561852,
        0.0015924281906336546,
        0.00025238291709683836,
    ];
    assert_close_f64(&got, &want, 2e-6, "linear");
}

/// The inverse frequencies of a rotate-half `Rope` with these settings.
fn printed_inv_freq(theta: f64, rotary_dim: usize, scaling: RopeScaling) -> Vec<f64> {
    rope(theta, rotary_dim, RopeLayout::RotateHalf, scaling)
        .inverse_frequencies()
        .unwrap()
}

/// Relative error below `rel` at the listed `(index, value)` pairs.
fn assert_close_at(got: &[f64], want: &[(usize, f64)], rel: f64, context: &str) {
    for &(i, w) in want {
        assert!(
            ((got[i] - w) / w).abs() < rel,
            "{context} {i}: {} vs {w}",
            got[i]
        );
    }
}

/// Relative closeness of f64 values.
fn assert_close_f64(got: &[f64], want: &[f64], rel: f64, context: &str) {
    assert_eq!(got.len(), want.len(), "{context}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= rel * w.abs(),
            "{context}: pair {i}: {g:e} vs {w:e}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The angles and the rotation

/// Positions far out, as a long context reaches them: up to `2^31 - 1`.
const FAR: [usize; 5] = [1_000, 100_000, 1_000_000, 123_456_789, (1 << 31) - 1];

/// `cos_sin` against the f64 reference (`transformers`' formula evaluated in f64: the angle
/// `position · inv_freq` in f64, its cos and sin, times the attention factor) at every 7th
/// position below 3000 and at [`FAR`]: within one f32 rounding of the reference, plus what the
/// f64 angle itself carries at far positions (the crate's and the reference's `inv_freq` may
/// differ in their last bits, which the position multiplies: 8 ulp of the angle, 2^-50 of it,
/// about 1e-7 radians at position 2^31 - 1 with `inv_freq` near 0.05; transformers' own f32
/// angles are off by whole radians there).
#[test]
fn cos_sin_is_cos_and_sin_times_the_attention_factor() {
    for scaling in scalings() {
        let r = rope(10_000.0, 12, RopeLayout::RotateHalf, scaling);
        let angles = RopeAngles::new(r, 12).unwrap();
        let inv = hf_inv_freq(&r);
        let factor = scaling.attention_factor();
        assert!(angles.max_position() >= (1 << 31) - 1, "{scaling:?}");
        for p in (0..3000).step_by(7).chain([2999]).chain(FAR) {
            for (i, &f) in inv.iter().enumerate() {
                let (cos, sin) = angles.cos_sin(p, i).unwrap();
                let angle = p as f64 * f;
                let angle_error = angle * 2f64.powi(-50) * factor;
                for (got, want) in [(cos, angle.cos() * factor), (sin, angle.sin() * factor)] {
                    let err = (got as f64 - want).abs();
                    assert!(
                        err <= 6e-8 * want.abs() + 1e-12 + angle_error,
                        "{scaling:?} p {p} i {i}: {got} vs {want}"
                    );
                }
            }
        }
        let last = angles.max_position();
        assert!(angles.cos_sin(last, 0).is_some() && angles.cos_sin(last + 1, 0).is_none());
        assert!(angles.cos_sin(0, inv.len()).is_none());
    }
}

/// The angles' memory is the frequencies alone, whatever the positions reached: a clone of
/// the layer's embedding is equal before and after rotating rows at far positions.
#[test]
fn rotating_far_rows_changes_nothing_kept() {
    let r = rope(500_000.0, 128, RopeLayout::RotateHalf, LLAMA3);
    let angles = RopeAngles::new(r, 128).unwrap();
    let before = angles.clone();
    let mut rows = vec![1.0; FAR.len() * 128];
    let shape = RopeRows {
        rows: FAR.len(),
        heads: 1,
        row_stride: 128,
    };
    angles
        .rotate(&mut rows, shape, RopePositions::Explicit(&FAR))
        .unwrap();
    assert_eq!(angles, before);
    assert!(rows.iter().all(|v| v.is_finite()));
}

/// Rotates a random `(rows, heads, head_dim)` buffer with gaps between rows by the crate and by
/// the reference; everything outside the rotary features is untouched, bit for bit.
fn check_rotation(r: Rope, head_dim: usize, heads: usize, rows: usize, explicit: bool, seed: u64) {
    let capacity = 50;
    let angles = RopeAngles::new(r, head_dim).unwrap();
    let width = heads * head_dim;
    let stride = width + 3;
    let mut rng = Rng::new(seed);
    let input = rng.vec(rows * stride, 1.0);
    // Random positions below `capacity`, and the far ones on the first rows.
    let positions: Vec<usize> = (0..rows)
        .map(|row| match FAR.get(row) {
            Some(&far) if seed.is_multiple_of(2) => far,
            _ => rng.next_u64() as usize % capacity,
        })
        .collect();
    // Whole sequences of `len` rows, each from `start`.
    let len = 3;
    assert_eq!(rows % len, 0, "rows must be whole sequences");
    let start = capacity - len;
    let starts = vec![start; rows / len];
    let pos = match explicit {
        true => RopePositions::Explicit(&positions),
        false => RopePositions::PerSequence {
            starts: &starts,
            len,
        },
    };
    let mut got = input.clone();
    let shape = RopeRows {
        rows,
        heads,
        row_stride: stride,
    };
    angles.rotate(&mut got, shape, pos).unwrap();
    // The reference on the rows without their gaps.
    let mut want: Vec<f64> = (0..rows)
        .flat_map(|row| input[row * stride..][..width].iter().map(|&v| v as f64))
        .collect();
    let sequence: Vec<usize> = (0..rows).map(|row| start + row % len).collect();
    let inv = hf_inv_freq(&r);
    let at = if explicit { &positions } else { &sequence };
    ref_rope(&r, &inv, Some(at)).rotate(&mut want, width, head_dim, rows);
    let context = format!("{r:?} head_dim {head_dim} heads {heads} explicit {explicit}");
    for row in 0..rows {
        let got_row = &got[row * stride..][..stride];
        assert_close(
            &got_row[..width],
            &want[row * width..][..width],
            2e-6,
            2e-6,
            &context,
        );
        assert_bits_eq(
            &got_row[width..],
            &input[row * stride + width..][..3],
            &context,
        );
        for head in 0..heads {
            let features = head * head_dim + r.rotary_dim..(head + 1) * head_dim;
            let untouched = &input[row * stride..][features.clone()];
            assert_bits_eq(
                &got_row[features],
                untouched,
                &format!("{context}: pass-through"),
            );
        }
    }
}

#[test]
fn rotation_against_the_reference_on_odd_shapes() {
    let layouts = [RopeLayout::RotateHalf, RopeLayout::Interleaved];
    let shapes = [
        (6, 3, 6),
        (10, 2, 6),
        (12, 5, 12),
        (18, 1, 8),
        (18, 3, 18),
        (10, 2, 0),
    ];
    let mut seed = 0;
    for scaling in scalings() {
        for layout in layouts {
            for (head_dim, heads, rotary_dim) in shapes {
                for explicit in [false, true] {
                    seed += 1;
                    let r = rope(10_000.0, rotary_dim, layout, scaling);
                    check_rotation(r, head_dim, heads, 9, explicit, seed);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Whole layers

/// A layer with these weights and `r`.
fn rope_layer<const D: usize, const KV: usize>(
    w: &Weights<D, D, KV>,
    h: usize,
    masking: Masking,
    r: Rope,
    (isa, threads): (Isa, usize),
) -> Mha<D, D, KV> {
    Mha::builder(&w.params, h)
        .masking(masking)
        .biases(w.biases.clone())
        .isa(isa)
        .threads(threads)
        .min_work_per_thread(0)
        .rope(r)
        .build()
        .expect("valid layer")
}

/// `forward_into` with `rope` against the oracle on rotated queries and keys, on every
/// configuration; then decoding the same tokens in steps of 1 and 3 gives the forward's bits.
fn check_layer<const B: usize, const T: usize, const D: usize, const KV: usize>(
    h: usize,
    r: Rope,
    masking: Masking,
    positions: Option<&[usize]>,
    seed: u64,
) {
    let w = Weights::<D, D, KV>::random(seed, [true, true, false, true]);
    let x = common::modes::input::<B, T, D>(seed + 1);
    let inv = hf_inv_freq(&r);
    let mut a = w.attend(B, T, h, x.as_slice(), None, masking);
    a.rope = Some(ref_rope(&r, &inv, positions));
    let want = common::reference_attend(&a);
    let options = AttendOptions {
        positions,
        ..AttendOptions::default()
    };
    let context = format!("B{B} T{T} D{D} KV{KV} H{h} {masking:?} {r:?} {positions:?}");
    let forward = check_all(
        &want,
        [B, h, T, T],
        |isa, threads| rope_layer(&w, h, masking, r, (isa, threads)),
        |layer, weights| {
            let mut out = Tensor::<B, T, D>::from_fn(|_, _, _| f32::NAN);
            layer.forward_into(&x, options, output(&mut out, weights))?;
            Ok(out.into_vec())
        },
        &context,
    );
    if masking == Masking::Causal {
        let config = configs()[0];
        let mut layer = rope_layer(&w, h, masking, r, config);
        for step in [1, 3] {
            let decoded = decode_in_steps(&mut layer, x.as_slice(), B, T, step, positions);
            assert_bits_eq(
                &decoded,
                &forward,
                &format!("{context}: decode in steps of {step}"),
            );
        }
    }
}

/// Decodes `x (batch, len, D)` in steps of `step` tokens into a fresh cache, the positions (when
/// given, `(batch, len)`) cut the same way; returns the outputs `(batch, len, D)`.
fn decode_in_steps<const D: usize, const KV: usize>(
    layer: &mut Mha<D, D, KV>,
    x: &[f32],
    batch: usize,
    len: usize,
    step: usize,
    positions: Option<&[usize]>,
) -> Vec<f32> {
    let mut cache = layer.new_cache(batch, len).unwrap();
    let mut out = vec![0.0; batch * len * D];
    for begin in (0..len).step_by(step) {
        let n = step.min(len - begin);
        let cut = |v: &[f32]| -> Vec<f32> {
            (0..batch)
                .flat_map(|b| v[(b * len + begin) * D..][..n * D].to_vec())
                .collect()
        };
        let chunk_positions: Option<Vec<usize>> = positions.map(|p| {
            (0..batch)
                .flat_map(|b| p[b * len + begin..][..n].to_vec())
                .collect()
        });
        let options = AttendOptions {
            positions: chunk_positions.as_deref(),
            ..AttendOptions::default()
        };
        let tokens = cut(x);
        let mut y = vec![0.0; batch * n * D];
        let input = Tokens::new(&tokens, batch, n, D).unwrap();
        let target = Output::new(&mut y, batch, n, D).unwrap();
        layer
            .decode_into(input, &mut cache, options, target)
            .unwrap();
        for b in 0..batch {
            out[(b * len + begin) * D..][..n * D].copy_from_slice(&y[b * n * D..][..n * D]);
        }
    }
    out
}

#[test]
fn layers_with_rope_against_the_reference() {
    use RopeLayout::{Interleaved, RotateHalf};
    let mut seed = 100;
    let mut next = || {
        seed += 10;
        seed
    };
    // Explicit positions: batch element 0 at 5.., element 1 left-padded-like (repeats, gaps).
    let explicit: Vec<usize> = (5..12).chain([0, 0, 1, 2, 3, 9, 4]).collect();
    for scaling in scalings() {
        for (layout, full, partial) in [(RotateHalf, 6, 4), (Interleaved, 6, 2)] {
            // head_dim 6: H 3, one key/value head (MQA).
            let r = rope(10_000.0, full, layout, scaling);
            check_layer::<2, 7, 18, 6>(3, r, Masking::Causal, None, next());
            let r = rope(10_000.0, partial, layout, scaling);
            check_layer::<2, 7, 18, 6>(3, r, Masking::Causal, Some(&explicit), next());
        }
        for layout in [RotateHalf, Interleaved] {
            // head_dim 10: H 6, Hkv 2 (partial rotary 6).
            let r = rope(500_000.0, 6, layout, scaling);
            check_layer::<2, 7, 60, 20>(6, r, Masking::Causal, Some(&explicit), next());
            // head_dim 12: H 3 = Hkv, bidirectional.
            let r = rope(10_000.0, 12, layout, scaling);
            check_layer::<2, 7, 36, 36>(3, r, Masking::Bidirectional, None, next());
            // head_dim 18: H 3, Hkv 1, partial rotary 8.
            let r = rope(1e6, 8, layout, scaling);
            check_layer::<2, 7, 54, 18>(3, r, Masking::Causal, None, next());
        }
    }
}

/// A left-padded batch: element 1's real tokens, at positions 0.. after two padding tokens
/// hidden by the padding mask, give what they give alone.
#[test]
fn left_padded_batch_with_explicit_positions() {
    const D: usize = 30;
    const KV: usize = 10;
    let w = Weights::<D, D, KV>::random(7, [true; 4]);
    let r = rope(10_000.0, 10, RopeLayout::RotateHalf, LLAMA3);
    let mut layer = rope_layer(&w, 3, Masking::Causal, r, configs()[0]);
    let x = common::modes::input::<2, 6, D>(8);
    let positions = [0, 1, 2, 3, 4, 5, 0, 0, 0, 1, 2, 3];
    let padding: Vec<bool> = (0..12).map(|i| !(6..8).contains(&i)).collect();
    let options = AttendOptions {
        positions: Some(&positions),
        key_padding_mask: Some(&padding),
        ..AttendOptions::default()
    };
    let mut out = Tensor::<2, 6, D>::zeros();
    layer.forward_into(&x, options, &mut out).unwrap();
    let alone = Tensor::<1, 4, D>::from_fn(|_, t, i| x[(1, t + 2, i)]);
    let y = layer.forward(&alone).unwrap();
    let want: Vec<f64> = y.as_slice().iter().map(|&v| v as f64).collect();
    assert_close(
        &out.as_slice()[(6 + 2) * D..],
        &want,
        ABS,
        REL,
        "left padded",
    );
}

// ---------------------------------------------------------------------------------------------
// Properties (quickcheck)

const PD: usize = 30;
const PKV: usize = 10;

/// A random rope for heads of 10 features, from a few random bytes.
fn random_rope(choice: u8, rotary: u8) -> Rope {
    let scaling = scalings()[usize::from(choice) % 5];
    let layout = match choice / 5 % 2 {
        0 => RopeLayout::RotateHalf,
        _ => RopeLayout::Interleaved,
    };
    rope(10_000.0, 2 * (usize::from(rotary) % 6), layout, scaling)
}

/// A layer `Mha<30, 30, 10>` (3 heads of 10, one key/value head) with `r`, if any.
fn property_layer(seed: u64, r: Option<Rope>) -> Mha<PD, PD, PKV> {
    let w = Weights::<PD, PD, PKV>::random(seed, [true, true, true, false]);
    let builder = Mha::builder(&w.params, 3)
        .biases(w.biases.clone())
        .threads(1);
    let builder = match r {
        Some(r) => builder.rope(r),
        None => builder,
    };
    builder.build().unwrap()
}

/// `layer` on the `(batch, t)` tokens `x` at `positions` (`None`: the default): decoded into
/// `cache` when one is given (the default positions then continue from it), else the forward.
fn run_at(
    layer: &mut Mha<PD, PD, PKV>,
    cache: Option<&mut KvCache>,
    x: &[f32],
    (batch, t): (usize, usize),
    positions: Option<&[usize]>,
) -> Vec<f32> {
    let mut y = vec![0.0; batch * t * PD];
    let options = AttendOptions {
        positions,
        ..AttendOptions::default()
    };
    let tokens = Tokens::new(x, batch, t, PD).unwrap();
    let out = Output::new(&mut y, batch, t, PD).unwrap();
    match cache {
        Some(cache) => layer.decode_into(tokens, cache, options, out),
        None => layer.forward_into(tokens, options, out),
    }
    .unwrap();
    y
}

/// Decoding `x` after `p` cached tokens (positions continuing from the cache) equals decoding
/// them with explicit positions `p ..` after the prefix decoded at explicit positions `0 .. p`,
/// and the tail of a forward over prefix and tokens at explicit positions, bit for bit.
fn offset_equals_cache(seed: u64, choice: u8, rotary: u8, sizes: u8) -> TestResult {
    let (p, t, batch) = (
        usize::from(sizes % 9),
        1 + usize::from(sizes / 9 % 5),
        1 + usize::from(sizes / 45 % 2),
    );
    let r = random_rope(choice, rotary);
    let mut layer = property_layer(seed, Some(r));
    let mut rng = Rng::new(seed ^ 0x5eed);
    let prefix = rng.vec(batch * p * PD, 1.0);
    let x = rng.vec(batch * t * PD, 1.0);
    let run = |layer: &mut Mha<PD, PD, PKV>, explicit: bool| {
        let mut cache = layer.new_cache(batch, p + t).unwrap();
        let range = |from: usize, n: usize| -> Vec<usize> {
            (0..batch).flat_map(|_| from..from + n).collect()
        };
        let (first, second) = (range(0, p), range(p, t));
        let first = explicit.then_some(&first[..]);
        run_at(layer, Some(&mut cache), &prefix, (batch, p), first);
        let second = explicit.then_some(&second[..]);
        run_at(layer, Some(&mut cache), &x, (batch, t), second)
    };
    let continuing = run(&mut layer, false);
    let explicit = run(&mut layer, true);
    assert_bits_eq(&explicit, &continuing, "explicit positions vs cache length");
    // The forward over [prefix, x] with positions 0 .. p + t: its last t tokens.
    let joined: Vec<f32> = (0..batch)
        .flat_map(|b| {
            let head = prefix[b * p * PD..][..p * PD].iter();
            head.chain(&x[b * t * PD..][..t * PD])
                .copied()
                .collect::<Vec<_>>()
        })
        .collect();
    let all: Vec<usize> = (0..batch).flat_map(|_| 0..p + t).collect();
    let y = run_at(&mut layer, None, &joined, (batch, p + t), Some(&all));
    for b in 0..batch {
        let tail = &y[(b * (p + t) + p) * PD..][..t * PD];
        assert_bits_eq(
            tail,
            &continuing[b * t * PD..][..t * PD],
            "forward tail vs decode",
        );
    }
    TestResult::passed()
}

#[test]
fn explicit_positions_offset_by_p_equal_decoding_after_p_cached_tokens() {
    QuickCheck::new()
        .tests(60)
        .quickcheck(offset_equals_cache as fn(u64, u8, u8, u8) -> TestResult);
}

/// `rotary_dim = 0` is no rotary embedding, bit for bit (forward with any positions, decode).
fn rotary_dim_zero_is_no_rope(seed: u64, choice: u8, len: u8) -> TestResult {
    let t = 1 + usize::from(len % 9);
    let r = Rope {
        rotary_dim: 0,
        ..random_rope(choice, 0)
    };
    let (mut with, mut without) = (property_layer(seed, Some(r)), property_layer(seed, None));
    let x = Rng::new(seed).vec(2 * t * PD, 1.0);
    let positions: Vec<usize> = (0..2 * t).map(|i| (i * 7 + 3) % 64).collect();
    let outs =
        [&mut with, &mut without].map(|layer| run_at(layer, None, &x, (2, t), Some(&positions)));
    assert_bits_eq(&outs[0], &outs[1], "forward");
    let decoded = [&mut with, &mut without].map(|layer| decode_in_steps(layer, &x, 2, t, 2, None));
    assert_bits_eq(&decoded[0], &decoded[1], "decode");
    TestResult::passed()
}

#[test]
fn rotary_dim_zero_equals_no_rope() {
    QuickCheck::new()
        .tests(40)
        .quickcheck(rotary_dim_zero_is_no_rope as fn(u64, u8, u8) -> TestResult);
}

/// Decoding token by token (or in steps of any size) equals the forward, bit for bit, with
/// default or explicit positions.
fn decode_equals_forward(seed: u64, choice: u8, rotary: u8, sizes: u8) -> TestResult {
    let (t, step, batch) = (
        1 + usize::from(sizes % 11),
        1 + usize::from(sizes / 11 % 4),
        1 + usize::from(sizes / 44 % 3),
    );
    let mut layer = property_layer(seed, Some(random_rope(choice, rotary)));
    let x = Rng::new(seed).vec(batch * t * PD, 1.0);
    let positions: Vec<usize> = (0..batch * t)
        .map(|i| (seed as usize).wrapping_add(i * 5) % 64)
        .collect();
    for explicit in [None, Some(&positions[..])] {
        let y = run_at(&mut layer, None, &x, (batch, t), explicit);
        let decoded = decode_in_steps(&mut layer, &x, batch, t, step, explicit);
        assert_bits_eq(
            &decoded,
            &y,
            &format!("steps of {step}, explicit {}", explicit.is_some()),
        );
    }
    TestResult::passed()
}

#[test]
fn decode_token_by_token_equals_forward() {
    QuickCheck::new()
        .tests(60)
        .quickcheck(decode_equals_forward as fn(u64, u8, u8, u8) -> TestResult);
}

/// RoPE's point: scores depend on relative positions only, so shifting every position by the
/// same offset changes the outputs by rounding alone.
#[test]
fn shifted_positions_change_outputs_by_rounding_only() {
    let mut layer = property_layer(
        3,
        Some(rope(
            10_000.0,
            10,
            RopeLayout::RotateHalf,
            RopeScaling::Default,
        )),
    );
    let x = Rng::new(4).vec(5 * PD, 1.0);
    let mut outs = Vec::new();
    for shift in [0, 1, 17, 50] {
        let positions: Vec<usize> = (shift..shift + 5).collect();
        outs.push(run_at(&mut layer, None, &x, (1, 5), Some(&positions)));
    }
    let want: Vec<f64> = outs[0].iter().map(|&v| v as f64).collect();
    for y in &outs[1..] {
        assert_close(y, &want, 1e-5, 1e-5, "shifted positions");
    }
}

/// A windowed RoPE layer on a rolling cache decodes 100,000 tokens one at a time: after the
/// first thousand steps nothing is allocated (constant memory: no table grows with the
/// positions), and the outputs of the last window match the f64 reference computed on the last
/// two windows of tokens at their absolute positions.
#[test]
fn a_rolling_rope_layer_decodes_100k_tokens_in_constant_memory() {
    const TOKENS: usize = 100_000;
    const WINDOW: usize = 64;
    let tail = 2 * WINDOW;
    let r = rope(10_000.0, 10, RopeLayout::RotateHalf, LLAMA3);
    let w = Weights::<PD, PD, PKV>::random(77, [true, true, true, false]);
    let mut layer = Mha::builder(&w.params, 3)
        .biases(w.biases.clone())
        .threads(1)
        .rope(r)
        .sliding_window(WINDOW)
        .build()
        .unwrap();
    let mut cache = layer.new_cache(1, 1).unwrap();
    let mut rng = Rng::new(78);
    let (mut token, mut out) = (vec![0.0; PD], vec![0.0; PD]);
    let (mut x_tail, mut y_tail) = (Vec::new(), Vec::new());
    let mut allocated = 0;
    for t in 0..TOKENS {
        token.iter_mut().for_each(|v| *v = rng.uniform());
        let before = counting_alloc::allocations();
        layer
            .decode_into(
                Tokens::new(&token, 1, 1, PD).unwrap(),
                &mut cache,
                AttendOptions::default(),
                Output::new(&mut out, 1, 1, PD).unwrap(),
            )
            .unwrap();
        if t >= 1000 {
            allocated += counting_alloc::allocations() - before;
        }
        if t >= TOKENS - tail {
            x_tail.extend_from_slice(&token);
            y_tail.extend_from_slice(&out);
        }
    }
    assert_eq!(allocated, 0, "allocations after the first 1000 steps");
    let positions: Vec<usize> = (TOKENS - tail..TOKENS).collect();
    let inv = hf_inv_freq(&r);
    let mut a = w.attend(1, tail, 3, &x_tail, None, Masking::Causal);
    a.window = Some(WINDOW);
    a.rope = Some(ref_rope(&r, &inv, Some(&positions)));
    let want = common::reference_attend(&a);
    let last = (tail - WINDOW) * PD..;
    assert_close(
        &y_tail[last.clone()],
        &want.y[last],
        ABS,
        REL,
        "the last window after 100,000 tokens",
    );
}

// ---------------------------------------------------------------------------------------------
// Errors

fn build(r: Rope) -> Result<Mha<PD, PD, PKV>, ShapeError> {
    let w = Weights::<PD, PD, PKV>::random(1, [false; 4]);
    Mha::builder(&w.params, 3).rope(r).build()
}

#[test]
fn bad_settings_are_errors_naming_the_values() {
    let base = rope(10_000.0, 10, RopeLayout::RotateHalf, RopeScaling::Default);
    for rotary_dim in [3, 12, usize::MAX] {
        let err = build(Rope { rotary_dim, ..base }).unwrap_err();
        assert_eq!(
            err,
            ShapeError::RotaryDim {
                rotary_dim,
                head_dim: 10
            }
        );
        assert!(
            err.to_string()
                .contains(&format!("rotary_dim {rotary_dim}")),
            "{err}"
        );
    }
    let setting = |what, value: f64| ShapeError::Setting {
        what,
        value: format!("{value:?}"),
        expected: "finite and > 0",
    };
    for theta in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let err = build(Rope { theta, ..base }).unwrap_err();
        assert_eq!(err, setting("rope_theta", theta));
        assert!(
            err.to_string().contains(&format!("rope_theta is {theta}")),
            "{err}"
        );
    }
    let cases = [
        (
            RopeScaling::Linear { factor: 0.0 },
            setting("rope_scaling factor", 0.0),
        ),
        (
            llama3(4.0, 4.0, 64.0),
            ShapeError::Setting {
                what: "rope_scaling high_freq_factor",
                value: "4.0 (low_freq_factor 4.0)".into(),
                expected: "above low_freq_factor",
            },
        ),
        (
            llama3(1.0, 4.0, f64::NAN),
            setting("rope_scaling original_max_position_embeddings", f64::NAN),
        ),
        (
            with_yarn(|f| f[0] = -2.0),
            setting("rope_scaling factor", -2.0),
        ),
        (
            with_yarn(|f| f[2] = 0.0),
            setting("rope_scaling beta_fast", 0.0),
        ),
        (
            with_yarn(|f| f[4] = f64::INFINITY),
            setting("rope_scaling attention_factor", f64::INFINITY),
        ),
    ];
    for (scaling, want) in cases {
        let err = build(Rope { scaling, ..base }).unwrap_err();
        assert_eq!(err, want, "{scaling:?}");
        if let ShapeError::Setting { what, value, .. } = &want {
            let text = err.to_string();
            assert!(text.contains(&format!("{what} is {value}")), "{text}");
        }
    }
    // The largest position: the last whose angles sin_cos reduces exactly (inv_freq[0] = 1).
    let max = mha::kernels::trig::MAX_ANGLE.floor() as usize;
    assert_eq!(build(base).unwrap().rope().unwrap().max_position(), max);
    // rotary_dim 0 turns nothing: every position is allowed.
    let none = build(Rope {
        rotary_dim: 0,
        ..base
    });
    assert_eq!(none.unwrap().rope().unwrap().max_position(), usize::MAX);
}

#[test]
fn attention_factors_beyond_f32_are_errors() {
    let base = rope(10_000.0, 10, RopeLayout::RotateHalf, RopeScaling::Default);
    // cos and sin are multiplied by the attention factor in f32: a factor that is finite
    // in f64 but not in f32 (or 0 there) would make them infinities (zeros).
    for factor in [1e39, f64::from(f32::MAX) * 2.0, 1e-50] {
        let scaling = with_yarn(|f| f[4] = factor);
        let err = build(Rope { scaling, ..base }).unwrap_err();
        let want = ShapeError::Setting {
            what: "rope_scaling attention_factor",
            value: format!("{factor:?} ({:?} in f32)", factor as f32),
            expected: "finite and > 0 in f32",
        };
        assert_eq!(err, want);
    }
    // The largest factor that stays finite in f32 builds.
    let scaling = with_yarn(|f| f[4] = f64::from(f32::MAX));
    build(Rope { scaling, ..base }).unwrap();
}

/// Llama 3 scaling by 8 with these frequency factors and original context.
fn llama3(low_freq_factor: f64, high_freq_factor: f64, original: f64) -> RopeScaling {
    RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor,
        high_freq_factor,
        original_max_position_embeddings: original,
    }
}

/// YaRN with its numbers `[factor, original, beta_fast, beta_slow, attention_factor]` edited.
fn with_yarn(edit: impl Fn(&mut [f64; 5])) -> RopeScaling {
    let mut f = [4.0, 64.0, 32.0, 1.0, 1.1];
    edit(&mut f);
    RopeScaling::Yarn {
        factor: f[0],
        original_max_position_embeddings: f[1],
        beta_fast: f[2],
        beta_slow: f[3],
        attention_factor: f[4],
        truncate: true,
    }
}

#[test]
fn positions_beyond_the_largest_are_errors_and_leave_the_cache_as_it_was() {
    let r = rope(10_000.0, 10, RopeLayout::Interleaved, LLAMA3);
    let mut layer = build(r).unwrap();
    let max = layer.rope().unwrap().max_position();
    let x = Tensor::<1, 3, PD>::from_fn(|_, t, i| (t * PD + i) as f32 * 0.01);
    let mut out = Tensor::<1, 3, PD>::zeros();
    let mut cache = layer.new_cache(1, 10).unwrap();
    layer
        .decode_into(&x, &mut cache, AttendOptions::default(), &mut out)
        .unwrap();
    // Explicit positions: the largest fits, one more does not.
    let fits = [0, max - 1, max];
    let options = AttendOptions {
        positions: Some(&fits),
        ..AttendOptions::default()
    };
    layer.forward_into(&x, options, &mut out).unwrap();
    let beyond = [0, 3, max + 1];
    let options = AttendOptions {
        positions: Some(&beyond),
        ..AttendOptions::default()
    };
    let err = layer.forward_into(&x, options, &mut out).unwrap_err();
    let want = ShapeError::RopePosition {
        index: 2,
        position: max + 1,
        max,
    };
    assert_eq!(err, want);
    assert!(
        err.to_string().contains(&format!(
            "rotary position {} of token 2 is beyond {max}",
            max + 1
        )),
        "{err}"
    );
    let err = layer
        .decode_into(&x, &mut cache, options, &mut out)
        .unwrap_err();
    assert_eq!(err, want);
    assert_eq!(cache.len(), 3);
    let options = AttendOptions {
        positions: Some(&[0, 1]),
        ..AttendOptions::default()
    };
    let err = layer.forward_into(&x, options, &mut out).unwrap_err();
    assert_eq!(
        err,
        ShapeError::LengthMismatch {
            what: "positions (B, T)",
            expected: 3,
            actual: 2
        }
    );
    // Cross-attention is not defined with rotary positions.
    let err = layer
        .cross_into(&x, &x, AttendOptions::default(), &mut out)
        .unwrap_err();
    assert_eq!(err, ShapeError::RopeCrossAttention);
}

#[test]
fn rotate_checks_its_buffer() {
    let r = rope(10_000.0, 4, RopeLayout::RotateHalf, RopeScaling::Default);
    let angles = RopeAngles::new(r, 6).unwrap();
    let max = angles.max_position();
    let mut buffer = vec![1.0; 20];
    let rows = |rows, heads, row_stride| RopeRows {
        rows,
        heads,
        row_stride,
    };
    let start = RopePositions::PerSequence {
        starts: &[0],
        len: 2,
    };
    let err = angles
        .rotate(&mut buffer, rows(2, 2, 11), start)
        .unwrap_err();
    assert!(
        matches!(
            err,
            ShapeError::DimensionMismatch {
                expected: 12,
                actual: 11,
                ..
            }
        ),
        "{err}"
    );
    let err = angles
        .rotate(&mut buffer, rows(2, 2, 12), start)
        .unwrap_err();
    assert_eq!(
        err,
        ShapeError::LengthMismatch {
            what: "rotary buffer (rows, row stride)",
            expected: 24,
            actual: 20
        }
    );
    let err = angles
        .rotate(
            &mut buffer,
            rows(1, 3, 18),
            RopePositions::PerSequence {
                starts: &[0],
                len: 0,
            },
        )
        .unwrap_err();
    assert!(
        matches!(err, ShapeError::DimensionMismatch { actual: 0, .. }),
        "{err}"
    );
    let err = angles
        .rotate(
            &mut buffer,
            rows(3, 1, 6),
            RopePositions::PerSequence {
                starts: &[max - 1],
                len: 3,
            },
        )
        .unwrap_err();
    assert_eq!(
        err,
        ShapeError::RopePosition {
            index: 2,
            position: max + 1,
            max
        }
    );
    let err = angles
        .rotate(
            &mut buffer,
            rows(3, 1, 6),
            RopePositions::PerSequence {
                starts: &[usize::MAX],
                len: 3,
            },
        )
        .unwrap_err();
    assert_eq!(
        err,
        ShapeError::RopePosition {
            index: 0,
            position: usize::MAX,
            max
        }
    );
    let err = angles
        .rotate(
            &mut buffer,
            rows(3, 1, 6),
            RopePositions::PerSequence {
                starts: &[0, 0],
                len: 2,
            },
        )
        .unwrap_err();
    assert_eq!(
        err,
        ShapeError::LengthMismatch {
            what: "rotary sequence starts times rows per sequence",
            expected: 3,
            actual: 4
        }
    );
    let err = angles
        .rotate(&mut buffer, rows(usize::MAX, 1, usize::MAX), start)
        .unwrap_err();
    assert_eq!(err, ShapeError::TooLarge);
    assert!(
        buffer.iter().all(|&v| v == 1.0),
        "nothing written on an error"
    );
    // Zero rows need nothing.
    angles
        .rotate(
            &mut [],
            rows(0, 5, 0),
            RopePositions::PerSequence {
                starts: &[99],
                len: 0,
            },
        )
        .unwrap();
}
