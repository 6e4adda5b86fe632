//! The score stage's layer settings: ALiBi (`MhaBuilder::alibi`), logit soft-capping
//! (`MhaBuilder::softcap`) and attention sinks (`MhaBuilder::sinks`), alone and together,
//! against the f64 oracle (`tests/common`, `Terms`) on odd shapes (H 3, 5, 6, 12 for the
//! non-power-of-two ALiBi slopes; GQA; biases; masks and padding; per-sequence lengths), on
//! every supported instruction set and 1 and 2 threads; decoding equals the forward pass bit for
//! bit; properties (a sink of `-inf`, slopes of 0 and a huge cap against no setting); errors.

mod common;

use common::modes::{check_all, configs, input, output, Mask, Opts, Weights, ABS, BOTH, REL};
use common::{assert_bits_eq, assert_close, batch_rows, reference_attend, Rng, Terms};
use mha::{Alibi, AttendOptions, AttentionWeights, Isa, Masking, Mha, MhaBuilder};
use mha::{Output, ShapeError, Tensor, Tokens};

/// One case's score settings.
#[derive(Clone, Debug, Default)]
struct Setting {
    slopes: Option<Vec<f32>>,
    cap: Option<f32>,
    sinks: Option<Vec<f32>>,
}

impl Setting {
    /// Standard ALiBi slopes for `h` heads.
    fn alibi(h: usize) -> Self {
        Setting {
            slopes: Some(Alibi::standard_slopes(h).unwrap()),
            ..Setting::default()
        }
    }

    /// A soft cap.
    fn cap(cap: f32) -> Self {
        Setting {
            cap: Some(cap),
            ..Setting::default()
        }
    }

    /// Sinks for `h` heads from `seed`: in [-2, 2), head 1 without one (`-inf`), the last
    /// large enough to take most of the mass.
    fn sinks(h: usize, seed: u64) -> Self {
        let mut sinks = Rng::new(seed).vec(h, 2.0);
        if h > 2 {
            sinks[1] = f32::NEG_INFINITY;
            sinks[h - 1] = 4.0;
        }
        Setting {
            sinks: Some(sinks),
            ..Setting::default()
        }
    }

    /// All three.
    fn all(h: usize, cap: f32, seed: u64) -> Self {
        Setting {
            cap: Some(cap),
            ..Setting {
                slopes: Setting::alibi(h).slopes,
                ..Setting::sinks(h, seed)
            }
        }
    }

    /// The settings on a builder.
    fn apply<'p, const D: usize, const E: usize, const KV: usize>(
        &self,
        mut builder: MhaBuilder<'p, D, E, KV>,
    ) -> MhaBuilder<'p, D, E, KV> {
        if let Some(slopes) = &self.slopes {
            builder = builder.alibi(Alibi::Slopes(slopes.clone()));
        }
        if let Some(cap) = self.cap {
            builder = builder.softcap(cap);
        }
        if let Some(sinks) = &self.sinks {
            builder = builder.sinks(sinks.clone());
        }
        builder
    }

    /// The settings for the oracle.
    fn terms(&self) -> Terms<'_> {
        Terms {
            slopes: self.slopes.as_deref(),
            cap: self.cap,
            sinks: self.sinks.as_deref(),
        }
    }
}

/// A layer with `w`'s weights and biases and the setting.
fn layer<const D: usize, const E: usize, const KV: usize>(
    w: &Weights<D, E, KV>,
    h: usize,
    masking: Masking,
    setting: &Setting,
    (isa, threads): (Isa, usize),
) -> Mha<D, E, KV> {
    let builder = Mha::builder(&w.params, h)
        .masking(masking)
        .biases(w.biases.clone())
        .isa(isa)
        .threads(threads)
        .min_work_per_thread(0);
    setting.apply(builder).build().expect("valid layer")
}

/// Self-attention with the setting through `forward_into`, against the oracle on every
/// configuration (outputs, weights, thread counts); returns the first configuration's output.
fn check<const B: usize, const T: usize, const D: usize, const KV: usize>(
    w: &Weights<D, D, KV>,
    h: usize,
    masking: Masking,
    opts: &Opts,
    setting: &Setting,
    context: &str,
) -> Vec<f32> {
    let x = input::<B, T, D>(B as u64 * 1000 + T as u64);
    let mut a = w.attend(B, T, h, x.as_slice(), None, masking);
    opts.apply(&mut a);
    a.terms = setting.terms();
    let want = reference_attend(&a);
    let context = format!("{context}: B{B} T{T} D{D} KV{KV} H{h} {masking:?} {setting:?}");
    check_all(
        &want,
        [B, h, T, T],
        |isa, threads| layer(w, h, masking, setting, (isa, threads)),
        |layer, weights| {
            let mut out = Tensor::<B, T, D>::from_fn(|_, _, _| f32::NAN);
            layer.forward_into(&x, opts.options(), output(&mut out, weights))?;
            Ok(out.into_vec())
        },
        &context,
    )
}

/// Options with padding: key lengths, a padding mask and an additive mask `(T, T)`.
fn padded<const B: usize, const T: usize>(seed: u64) -> Vec<Opts> {
    let mut rng = Rng::new(seed);
    let additive: Vec<f32> = (0..T * T)
        .map(|e| match e % 7 {
            3 => f32::NEG_INFINITY,
            _ => rng.uniform(),
        })
        .collect();
    vec![
        Opts::default(),
        Opts {
            key_lengths: Some((0..B).map(|b| T - (b * 3) % T).collect()),
            ..Opts::default()
        },
        Opts {
            key_padding_mask: Some((0..B * T).map(|e| e % 5 != 2).collect()),
            mask: Some(Mask::Additive(additive)),
            ..Opts::default()
        },
    ]
}

/// Every setting of the features for `h` heads.
fn settings(h: usize) -> Vec<Setting> {
    vec![
        Setting::alibi(h),
        Setting::cap(0.3),
        Setting::cap(2.0),
        Setting::sinks(h, h as u64),
        Setting::all(h, 0.5, 7),
    ]
}

/// Each feature on one shape, both maskings, with and without padding.
fn each_feature<const B: usize, const T: usize, const D: usize, const KV: usize>(
    h: usize,
    biases: [bool; 4],
) {
    let w = Weights::<D, D, KV>::random(D as u64 * 31 + h as u64, biases);
    for setting in settings(h) {
        for masking in BOTH {
            for (o, opts) in padded::<B, T>(h as u64).iter().enumerate() {
                check::<B, T, D, KV>(&w, h, masking, opts, &setting, &format!("options {o}"));
            }
        }
    }
}

#[test]
fn three_heads() {
    each_feature::<2, 7, 15, 15>(3, [false; 4]);
}

#[test]
fn five_heads_with_biases() {
    each_feature::<2, 5, 15, 15>(5, [true; 4]);
}

#[test]
fn six_heads_grouped() {
    // Six query heads of width 3 share two key/value heads.
    each_feature::<3, 6, 18, 6>(6, [true, false, true, false]);
}

#[test]
fn twelve_heads() {
    each_feature::<1, 9, 24, 24>(12, [false, true, false, true]);
}

/// More than one block of 96 queries and keys: the tile path, several key blocks.
#[test]
fn long_sequences() {
    let w = Weights::<15, 15, 5>::random(3, [true; 4]);
    for setting in settings(3) {
        for masking in BOTH {
            check::<1, 100, 15, 5>(&w, 3, masking, &Opts::default(), &setting, "long");
        }
    }
}

/// Cross-attention (queries aligned bottom-right with the memory's `S` keys, so query `i` is
/// at position `S - T + i`) with each feature, against the oracle.
#[test]
fn cross_attention() {
    const B: usize = 2;
    const T: usize = 5;
    const S: usize = 11;
    let w = Weights::<15, 7, 5>::random(19, [true; 4]);
    let x = input::<B, T, 15>(20);
    let memory = input::<B, S, 7>(21);
    for setting in settings(3) {
        for masking in BOTH {
            let mut a = w.attend(B, T, 3, x.as_slice(), Some((S, memory.as_slice())), masking);
            a.terms = setting.terms();
            let want = reference_attend(&a);
            check_all(
                &want,
                [B, 3, T, S],
                |isa, threads| layer(&w, 3, masking, &setting, (isa, threads)),
                |layer, weights| {
                    let mut out = Tensor::<B, T, 15>::from_fn(|_, _, _| f32::NAN);
                    let options = AttendOptions::default();
                    layer.cross_into(&x, &memory, options, output(&mut out, weights))?;
                    Ok(out.into_vec())
                },
                &format!("cross {masking:?} {setting:?}"),
            );
        }
    }
}

/// The standard slopes are `transformers`' `build_alibi_tensor` (BLOOM) values (printed by
/// transformers 4.x in f32): bit for bit where they are powers of two, within 1 ulp elsewhere
/// (torch's f32 `pow` is not correctly rounded; ours is the correctly rounded power of the same
/// f32 base: over H = 1..128, 65 of the 8,256 slopes differ, each by 1 ulp).
#[test]
#[allow(clippy::excessive_precision)]
fn standard_slopes_match_transformers() {
    let cases: [(usize, &[f32]); 6] = [
        (3, &[0.0625, 0.00390625, 0.25]),
        (5, &[0.25, 0.0625, 0.015625, 0.00390625, 0.5]),
        (6, &[0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125]),
        (
            7,
            &[0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125, 0.03125],
        ),
        (
            12,
            &[
                0.5,
                0.25,
                0.125,
                0.0625,
                0.03125,
                0.015625,
                0.0078125,
                0.00390625,
                0.7071067690849304,
                0.3535533845424652,
                0.1767766773700714,
                0.0883883386850357,
            ],
        ),
        (
            24,
            &[
                0.7071067690849304,
                0.4999999701976776,
                0.3535533845424652,
                0.2499999850988388,
                0.1767766773700714,
                0.1249999850988388,
                0.0883883386850357,
                0.0624999925494194,
                0.044194165617227554,
                0.031249994412064552,
                0.022097082808613777,
                0.015624997206032276,
                0.011048540472984314,
                0.007812498137354851,
                0.005524270236492157,
                0.0039062488358467817,
                0.8408964276313782,
                0.5946035981178284,
                0.4204482436180115,
                0.2973017990589142,
                0.21022413671016693,
                0.1486509144306183,
                0.10511206835508347,
                0.07432546466588974,
            ],
        ),
    ];
    let within_an_ulp = |got: &[f32], want: &[f32], context: &str| {
        assert_eq!(got.len(), want.len(), "{context}");
        for (g, w) in got.iter().zip(want) {
            let ulps = g.to_bits().abs_diff(w.to_bits());
            assert!(ulps <= 1, "{context}: {g} vs transformers' {w}");
        }
    };
    for (h, want) in cases {
        let got = Alibi::standard_slopes(h).unwrap();
        if h <= 8 {
            assert_bits_eq(&got, want, &format!("H {h}"));
        }
        within_an_ulp(&got, want, &format!("H {h}"));
    }
    // 48 heads: the 32 of 2^(-8/32)'s powers, then 16 odd powers of 2^(-4/32).
    let slopes = Alibi::standard_slopes(48).unwrap();
    let want_tail = [
        0.9170040488243103f32,
        0.7711054086685181,
        0.6484197974205017,
    ];
    within_an_ulp(&slopes[32..35], &want_tail, "H 48 extension");
    within_an_ulp(&slopes[47..], &[0.06815674901008606], "H 48 last");
    assert_eq!(Alibi::standard_slopes(64).unwrap()[7], 0.5);
    assert!(Alibi::standard_slopes(0).unwrap().is_empty());
}

/// Decoding in steps of 1, 3, 10 (tiles with a cached offset) and the rest gives the forward
/// pass's bits (its 100 rows through the tile path) for each feature and all together.
#[test]
fn decode_equals_forward_bit_for_bit() {
    const B: usize = 2;
    const T: usize = 100;
    const D: usize = 18;
    const KV: usize = 6;
    const H: usize = 6;
    let w = Weights::<D, D, KV>::random(11, [true; 4]);
    let x = input::<B, T, D>(12);
    for setting in settings(H) {
        for config in configs() {
            let context = format!("{setting:?} {config:?}");
            let mut layer = layer(&w, H, Masking::Causal, &setting, config);
            let forward = layer.forward(&x).unwrap().into_vec();
            let mut cache = layer.new_cache(B, T).unwrap();
            let mut decoded = vec![0.0; B * T * D];
            let mut t = 0;
            for len in [1, 3, 10, 1, T - 15] {
                let chunk = batch_rows(x.as_slice(), B, D, t..t + len);
                let mut out = vec![0.0; chunk.len()];
                let tokens = Tokens::new(&chunk, B, len, D).unwrap();
                let options = AttendOptions::default();
                let out_view = Output::new(&mut out, B, len, D).unwrap();
                layer
                    .decode_into(tokens, &mut cache, options, out_view)
                    .unwrap();
                for b in 0..B {
                    let at = (b * T + t) * D;
                    decoded[at..][..len * D].copy_from_slice(&out[b * len * D..][..len * D]);
                }
                t += len;
            }
            assert_bits_eq(&decoded, &forward, &context);
        }
    }
}

/// A batch of sequences of different lengths (`AttendOptions::token_lengths`), prefilled
/// together and decoded token by token with sequences finishing early: each sequence's rows
/// are its own forward pass, bit for bit, and that is the oracle's.
#[test]
fn per_sequence_lengths() {
    const B: usize = 3;
    const D: usize = 15;
    const H: usize = 5;
    const T: usize = 12;
    let lengths = [12, 4, 9];
    let w = Weights::<D, D, D>::random(13, [false, true, true, false]);
    let x = input::<B, T, D>(14);
    for setting in settings(H) {
        for config in configs() {
            let context = format!("{setting:?} {config:?}");
            let mut layer = layer(&w, H, Masking::Causal, &setting, config);
            let ragged = ragged_decode(&mut layer, x.as_slice(), &lengths);
            for (b, &n) in lengths.iter().enumerate() {
                let own = &x.as_slice()[b * T * D..][..n * D];
                let mut alone = vec![0.0; n * D];
                let tokens = Tokens::new(own, 1, n, D).unwrap();
                let out = Output::new(&mut alone, 1, n, D).unwrap();
                layer
                    .forward_into(tokens, AttendOptions::default(), out)
                    .unwrap();
                let got = &ragged[b * T * D..][..n * D];
                assert_bits_eq(got, &alone, &format!("{context} sequence {b}"));
                let mut a = w.attend(1, n, H, own, None, Masking::Causal);
                a.terms = setting.terms();
                let want = reference_attend(&a).y;
                assert_close(got, &want, ABS, REL, &format!("{context} sequence {b}"));
            }
        }
    }
}

/// Prefills 5 tokens of each sequence (fewer when it is shorter), then decodes one token per
/// step while any sequence has tokens left; returns the outputs `(B, T, D)` (rows past a
/// sequence's length are left 0).
fn ragged_decode<const D: usize>(layer: &mut Mha<D>, x: &[f32], lengths: &[usize]) -> Vec<f32> {
    let (b, t_len) = (lengths.len(), x.len() / (lengths.len() * D));
    let mut cache = layer.new_cache(b, t_len).unwrap();
    let mut y = vec![0.0; x.len()];
    let mut t = 0;
    while t < t_len {
        let len = if t == 0 { 5 } else { 1 };
        let real: Vec<usize> = lengths
            .iter()
            .map(|&n| n.saturating_sub(t).min(len))
            .collect();
        let chunk = batch_rows(x, b, D, t..t + len);
        let mut out = vec![0.0; chunk.len()];
        let options = AttendOptions {
            token_lengths: Some(&real),
            ..AttendOptions::default()
        };
        let tokens = Tokens::new(&chunk, b, len, D).unwrap();
        let out_view = Output::new(&mut out, b, len, D).unwrap();
        layer
            .decode_into(tokens, &mut cache, options, out_view)
            .unwrap();
        for (bi, &n) in real.iter().enumerate() {
            y[(bi * t_len + t) * D..][..n * D].copy_from_slice(&out[bi * len * D..][..n * D]);
        }
        t += len;
    }
    y
}

/// With a finite sink the weights of a row's keys sum to less than 1; the output is the
/// probability-weighted values, so a huge sink drives it to 0.
#[test]
fn sinks_take_probability_mass() {
    const D: usize = 12;
    let w = Weights::<D, D, D>::random(15, [false; 4]);
    let x = input::<1, 4, D>(16);
    let huge = Setting {
        sinks: Some(vec![0.0, 80.0, f32::NEG_INFINITY]),
        ..Setting::default()
    };
    let mut layer = layer(&w, 3, Masking::Causal, &huge, (Isa::detect(), 1));
    let mut weights = AttentionWeights::new();
    let mut y = Tensor::<1, 4, D>::zeros();
    let out = Output::from(&mut y).with_weights(&mut weights);
    layer
        .forward_into(&x, AttendOptions::default(), out)
        .unwrap();
    for i in 0..4 {
        let sum = |h: usize| {
            (0..4)
                .map(|j| weights.get(0, h, i, j).unwrap())
                .sum::<f32>()
        };
        assert!(sum(0) < 1.0 && sum(0) > 0.0, "head 0 row {i}: {}", sum(0));
        assert!(sum(1) < 1e-30, "head 1 row {i}: {}", sum(1));
        assert!((sum(2) - 1.0).abs() < 1e-5, "head 2 row {i}: {}", sum(2));
    }
}

/// A random case of the properties: `B`, `T` at run time, a head count dividing 12, a
/// masking, key lengths or not.
struct Random {
    b: usize,
    t: usize,
    h: usize,
    masking: Masking,
    key_lengths: Option<Vec<usize>>,
    x: Vec<f32>,
}

impl Random {
    fn new(seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let mut pick = |n: usize| (rng.next_u64() % n as u64) as usize;
        let (b, t) = (1 + pick(3), 1 + pick(30));
        let h = [1, 2, 3, 4, 6, 12][pick(6)];
        let masking = BOTH[pick(2)];
        let key_lengths = (pick(2) == 1).then(|| (0..b).map(|_| pick(t + 1)).collect());
        let x = Rng::new(seed ^ 0xabc).vec(b * t * 12, 1.5);
        Random {
            b,
            t,
            h,
            masking,
            key_lengths,
            x,
        }
    }

    /// The layer's output and weights with the setting.
    fn run(&self, w: &Weights<12, 12, 12>, setting: &Setting, isa: Isa) -> (Vec<f32>, Vec<f32>) {
        let mut layer = layer(w, self.h, self.masking, setting, (isa, 2));
        let mut y = vec![0.0; self.x.len()];
        let mut weights = AttentionWeights::new();
        let options = AttendOptions {
            key_lengths: self.key_lengths.as_deref(),
            ..AttendOptions::default()
        };
        let tokens = Tokens::new(&self.x, self.b, self.t, 12).unwrap();
        let out = Output::new(&mut y, self.b, self.t, 12).unwrap();
        layer
            .forward_into(tokens, options, out.with_weights(&mut weights))
            .unwrap();
        (y, weights.as_slice().to_vec())
    }
}

/// A sink of `-inf` is no sink and slopes of 0 are no ALiBi, bit for bit (the online softmax
/// starts from `(-inf, 0)` either way; `s + 0·(j - i)` is `s`, or `+0` for `s = -0`, which
/// the softmax cannot tell apart). A cap of 1e30 equals no cap within rounding, not bit for
/// bit: `1e30 · tanh(s / 1e30)` is `(s / 1e30) · 1e30`, two roundings, so a score may move by
/// an ulp (and `tanh` of a subnormal quotient returns it, keeping fewer bits).
#[test]
fn neutral_settings_change_nothing() {
    let w = Weights::<12, 12, 12>::random(17, [true; 4]);
    for seed in 0..24 {
        let case = Random::new(seed);
        let h = case.h;
        for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
            let context = format!("seed {seed} {isa:?} B{} T{} H{h}", case.b, case.t);
            let plain = case.run(&w, &Setting::default(), isa);
            let no_sink = Setting {
                sinks: Some(vec![f32::NEG_INFINITY; h]),
                ..Setting::default()
            };
            let zero_slopes = Setting {
                slopes: Some(vec![0.0; h]),
                ..Setting::default()
            };
            for (what, setting) in [("sinks -inf", no_sink), ("slopes 0", zero_slopes)] {
                let (y, weights) = case.run(&w, &setting, isa);
                assert_bits_eq(&y, &plain.0, &format!("{context} {what}: output"));
                assert_bits_eq(&weights, &plain.1, &format!("{context} {what}: weights"));
            }
            let (y, weights) = case.run(&w, &Setting::cap(1e30), isa);
            let near = |got: &[f32], want: &[f32], what: &str| {
                let want: Vec<f64> = want.iter().map(|&v| v as f64).collect();
                assert_close(
                    got,
                    &want,
                    1e-6,
                    1e-5,
                    &format!("{context} cap 1e30: {what}"),
                );
            };
            near(&y, &plain.0, "output");
            near(&weights, &plain.1, "weights");
        }
    }
}

/// Every bad setting is an error at build naming the values.
#[test]
fn bad_settings_are_errors() {
    let w = Weights::<12, 12, 12>::random(18, [false; 4]);
    let build = |setting: Setting| {
        setting
            .apply(Mha::builder(&w.params, 4))
            .build()
            .map(|_| ())
    };
    let wrong_count = |what: &'static str, actual| {
        Err(ShapeError::LengthMismatch {
            what,
            expected: 4,
            actual,
        })
    };
    let slopes = |v: Vec<f32>| Setting {
        slopes: Some(v),
        ..Setting::default()
    };
    let sinks = |v: Vec<f32>| Setting {
        sinks: Some(v),
        ..Setting::default()
    };
    assert_eq!(
        build(slopes(vec![0.5; 3])),
        wrong_count("ALiBi slopes (H)", 3)
    );
    assert_eq!(
        build(sinks(vec![0.5; 5])),
        wrong_count("attention sinks (H)", 5)
    );
    assert_eq!(
        build(sinks(Vec::new())),
        wrong_count("attention sinks (H)", 0)
    );
    let setting_error = |result: Result<(), ShapeError>| match result {
        Err(e @ ShapeError::Setting { .. }) => e.to_string(),
        other => panic!("expected a Setting error, got {other:?}"),
    };
    let message = setting_error(build(slopes(vec![0.5, f32::NAN, 0.1, 0.2])));
    assert_eq!(
        message,
        "ALiBi slopes (H) is NaN (head 1), but must be finite"
    );
    let message = setting_error(build(slopes(vec![0.5, 0.1, 0.2, f32::INFINITY])));
    assert!(message.contains("inf (head 3)"), "{message}");
    let message = setting_error(build(sinks(vec![0.5, 1.0, f32::INFINITY, 0.0])));
    assert_eq!(
        message,
        "attention sinks (H) is inf (head 2), but must be finite or -inf"
    );
    let message = setting_error(build(sinks(vec![f32::NAN, 1.0, 0.0, 0.0])));
    assert!(message.contains("NaN (head 0)"), "{message}");
    for cap in [0.0, -0.0, -1.5, f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
        let message = setting_error(build(Setting::cap(cap)));
        assert_eq!(
            message,
            format!("logit soft cap is {cap:?}, but must be finite and > 0")
        );
    }
    // Standard slopes always fit; the smallest positive cap is fine.
    let ok = Setting {
        slopes: None,
        ..Setting::cap(f32::from_bits(1))
    };
    assert_eq!(build(ok), Ok(()));
    let standard = Mha::builder(&w.params, 4).alibi(Alibi::Standard).build();
    assert_eq!(
        standard.unwrap().alibi_slopes(),
        Some(&Alibi::standard_slopes(4).unwrap()[..])
    );
}
