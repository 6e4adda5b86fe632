//! The public layer API on small configurations taken from the bytes: `Mha::builder` with every
//! setting, then `forward_into`, `cross_into`, `new_cache` and `decode_into` on run-time shapes.
//!
//! The first byte picks a const instantiation `(D, E, KV)`: self-attention layers with
//! `D ∈ {0, 1, 4, 6, 8, 12, 16}` and grouped key/value widths (valid for some head counts, and
//! `(4, 4, 3)` for none), and cross-attention layers with another memory width (`E = 0`
//! included). Then: the head count (a divisor of `D`, any byte, or 0, `D + 1`, `usize::MAX`),
//! the masking, the instruction set (any supported one; now and then any one at all), the
//! weights and each of the four biases (small values from a seeded generator, one byte per
//! value, or raw bits, with NaN, ±inf, huge and subnormal values dropped in now and then).
//! Three layers are built from them, with 1, 2 and 3 threads and `min_work_per_thread(0)`, and
//! each runs the same session (the rest of the bytes, read afresh for each layer):
//!
//! - a plain forward (no options, matching output) of `x (B ≤ 3, T ≤ 40)`;
//! - a forward with options: key lengths, a padding mask and a bool or additive mask, each
//!   of a length and with values that are usually right and sometimes not (lengths past `S`,
//!   `usize::MAX`, NaN and +inf in the mask, huge finite mask values); an output of another
//!   shape now and then; the attention weights on request;
//! - a cross-attention over a memory `(B', S ≤ 40)` (batch sometimes wrong), with options;
//! - a KV cache (batch sometimes wrong, capacity 0..=60, now and then made by another layer
//!   of the same `D`: other heads or another instruction set), then up to 8 steps that decode
//!   the next chunk of `x` (any size, options now and then) or clear the cache;
//! - the plain forward again.
//!
//! Checks:
//! 1. Nothing panics (libFuzzer reports a panic as a crash); the three constructors
//!    `Tokens::new`, `Output::new` and `new_cache` are checked on their own too.
//! 2. Every `Err` is one the documentation names for a rule these inputs break, and a call that
//!    breaks no rule is `Ok`. The rules, written out again here (`Expect`): head count 0
//!    (`ZeroHeads`) or not dividing `D` (`NotDivisible`); `KV` not `n_kv · (D / H)` with
//!    `n_kv` dividing `H` (`KvHeads`); an unsupported instruction set (`UnsupportedIsa`);
//!    an output of another batch or length, a memory or cache of another batch
//!    (`DimensionMismatch`); key lengths not `B` long, a padding mask not `B·S`, a mask neither
//!    `T·S` nor `B·T·S` (`LengthMismatch`); a key length past `S` (`KeyLength`); NaN or +inf
//!    in an additive mask (`MaskValue`); decoding with a bidirectional layer
//!    (`DecodeNeedsCausal`), past the cache's capacity (`CacheFull`) or into a cache of other
//!    key/value heads (`CacheMismatch`; a cache made for another instruction set may be
//!    refused so too). Weights `(B, H, T, S)` whose size overflows must fail with
//!    `Overflow`/`TooLarge`/`AllocationFailed`; nothing else may. The oracle is conservative:
//!    when several rules are broken any of their errors is accepted (the order of the checks
//!    is not promised). A call that fails leaves the cache's length as it was; one that
//!    succeeds adds its tokens.
//! 3. Where a call is `Ok` and every value it reads (weights, biases, tokens, memory) is finite
//!    and at most 1024 in size (so that no product can overflow `f32`), its output is finite;
//!    the attention weights are in `[0, 1]` and each row sums to 1 (within 1e-3) or is all
//!    zeros. An additive mask may hold any finite value and -inf here: it is accepted only then.
//! 4. With a causal layer, every decoding step that is `Ok` and has no options gives, bit for
//!    bit, the rows of the plain forward at the positions it decodes (the crate promises a
//!    forward equals decoding its tokens in steps of any sizes), NaN payloads included; the
//!    plain forward gives the same bits before and after the other calls.
//! 5. The three layers (1, 2 and 3 threads) give the same results: the same `Ok`/`Err`, the
//!    same output and weight bits (NaN payloads included), the same cache lengths.
//!
//! `run.sh` passes `lsan.supp` to LeakSanitizer (a thread-exit race it would report as a
//! leak); run by hand, set `LSAN_OPTIONS=suppressions=fuzz/lsan.supp` too. With
//! `LAYER_API_DEBUG` set, an input prints its configuration and every call's result.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mha::{
    AttendOptions, AttentionWeights, AttnMask, Isa, KvCache, Masking, Matrix, Mha, MhaBiases,
    MhaParams, Output, ShapeError, Tokens,
};
use mha_fuzz::Input;

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    match input.below(21) {
        0 => self_attention::<0, 0>(&mut input),
        1 => self_attention::<1, 1>(&mut input),
        2 => self_attention::<4, 4>(&mut input),
        3 => self_attention::<4, 2>(&mut input),
        4 => self_attention::<4, 1>(&mut input),
        5 => self_attention::<4, 3>(&mut input),
        6 => self_attention::<6, 6>(&mut input),
        7 => self_attention::<6, 3>(&mut input),
        8 => self_attention::<6, 2>(&mut input),
        9 => self_attention::<8, 8>(&mut input),
        10 => self_attention::<8, 4>(&mut input),
        11 => self_attention::<12, 12>(&mut input),
        12 => self_attention::<12, 4>(&mut input),
        13 => self_attention::<12, 3>(&mut input),
        14 => self_attention::<16, 16>(&mut input),
        15 => self_attention::<16, 8>(&mut input),
        16 => cross_attention::<4, 0, 4>(&mut input),
        17 => cross_attention::<4, 6, 2>(&mut input),
        18 => cross_attention::<6, 3, 6>(&mut input),
        19 => cross_attention::<0, 2, 0>(&mut input),
        _ => cross_attention::<12, 16, 6>(&mut input),
    }
});

/// The longest run-time sequence (`T`, `S`).
const MAX_LEN: usize = 40;
/// The largest cache capacity.
const MAX_CAPACITY: usize = 60;
/// Values of at most this size cannot overflow anywhere in a layer of these widths.
const TAME: f32 = 1024.0;
/// What an output holds before a call: a NaN that no tame call may leave behind.
const SENTINEL: u32 = 0x7fa5_a5a5;

// ---------------------------------------------------------------------------------------------
// Values

/// Values worth dropping into a buffer now and then.
const SPECIALS: [u32; 15] = [
    0x7fc0_0000, // NaN
    0xffc0_0000, // -NaN
    0x7fc0_1234, // NaN with a payload
    0x7f80_0001, // signalling NaN
    0xffff_ffff, // NaN, every bit set
    0x7f80_0000, // +inf
    0xff80_0000, // -inf
    0x8000_0000, // -0.0
    0x0000_0001, // the smallest subnormal
    0x0080_0000, // f32::MIN_POSITIVE
    0x4480_0000, // 1024.0 (still tame)
    0xc480_0000, // -1024.0
    0x7f7f_ffff, // f32::MAX
    0xff7f_ffff, // f32::MIN
    0x60ad_78ec, // 1e20
];

/// One special value, or (last) any bits at all.
fn special(input: &mut Input<'_>) -> f32 {
    match SPECIALS.get(input.below(SPECIALS.len() + 1)) {
        Some(&bits) => f32::from_bits(bits),
        None => raw(input),
    }
}

/// Four bytes as the bits of an `f32`.
fn raw(input: &mut Input<'_>) -> f32 {
    let b = [input.byte(), input.byte(), input.byte(), input.byte()];
    f32::from_bits(u32::from_le_bytes(b))
}

/// `n` values: from a generator seeded by a byte (small, in `[-2, 2]`), one byte each, or raw
/// bits; now and then with a few special values at chosen places.
fn values(input: &mut Input<'_>, n: usize) -> Vec<f32> {
    let how = input.byte();
    let mut v: Vec<f32> = match how % 4 {
        0 | 1 => {
            let mut state = u64::from(input.byte()) ^ 0x9e37_79b9_7f4a_7c15;
            (0..n)
                .map(|_| {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    ((state >> 40) % 257) as f32 / 64.0 - 2.0
                })
                .collect()
        }
        2 => (0..n)
            .map(|_| match input.byte() {
                b @ 0..=240 => f32::from(b as i8) / 16.0,
                b => f32::from_bits(SPECIALS[usize::from(b - 241)]),
            })
            .collect(),
        _ => (0..n).map(|_| raw(input)).collect(),
    };
    if how & 0x30 == 0x30 && n > 0 {
        for _ in 0..=input.below(4) {
            let at = usize::from(u16::from_le_bytes([input.byte(), input.byte()])) % n;
            v[at] = special(input);
        }
    }
    v
}

/// Whether no product or sum of these values (at the widths here) can overflow.
fn tame(values: &[f32]) -> bool {
    values.iter().all(|v| v.is_finite() && v.abs() <= TAME)
}

/// A run-time length, usually short.
fn length(input: &mut Input<'_>, max: usize) -> usize {
    match input.below(4) {
        0 => input.below(3),
        1 | 2 => input.below(9),
        _ => input.below(max + 1),
    }
}

/// `n` booleans, 8 to a byte, a zero bit being `true` (bytes that run out mean "visible").
fn bools(input: &mut Input<'_>, n: usize) -> Vec<bool> {
    let mut byte = 0;
    (0..n)
        .map(|i| {
            if i % 8 == 0 {
                byte = input.byte();
            }
            byte >> (i % 8) & 1 == 0
        })
        .collect()
}

/// `batch` sequences of `len` tokens of `width` values, flat.
struct Seq {
    data: Vec<f32>,
    batch: usize,
    len: usize,
    tame: bool,
}

impl Seq {
    fn new(input: &mut Input<'_>, batch: usize, len: usize, width: usize) -> Seq {
        let data = values(input, batch * len * width);
        Seq {
            tame: tame(&data),
            data,
            batch,
            len,
        }
    }

    fn tokens<const W: usize>(&self) -> Tokens<'_> {
        Tokens::new(&self.data, self.batch, self.len, W).expect("a token view of the right length")
    }

    /// Tokens `first .. first + len` of every sequence.
    fn rows<const W: usize>(&self, first: usize, len: usize) -> Seq {
        let mut data = Vec::with_capacity(self.batch * len * W);
        for b in 0..self.batch {
            data.extend_from_slice(&self.data[(b * self.len + first) * W..][..len * W]);
        }
        Seq {
            tame: tame(&data),
            data,
            batch: self.batch,
            len,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Options

enum Mask {
    Bool(Vec<bool>),
    Additive(Vec<f32>),
}

/// The owned data of an `AttendOptions`.
#[derive(Default)]
struct Opts {
    key_lengths: Option<Vec<usize>>,
    padding: Option<Vec<bool>>,
    mask: Option<Mask>,
}

impl Opts {
    /// Options for `b` sequences of `q` queries over `s` keys: each present or not, their
    /// lengths and values usually right.
    fn new(input: &mut Input<'_>, b: usize, q: usize, s: usize) -> Opts {
        let flags = input.byte();
        let len = |input: &mut Input<'_>, right: usize| match input.below(16) {
            15 => input.below(right + 3),
            14 => right + 1,
            _ => right,
        };
        let key_lengths = (flags & 1 != 0).then(|| {
            let n = len(input, b);
            (0..n)
                .map(|_| match input.below(16) {
                    15 => usize::MAX,
                    14 => s + 1 + input.below(2),
                    _ => input.below(s + 1),
                })
                .collect()
        });
        let padding = (flags & 2 != 0).then(|| {
            let n = len(input, b * s);
            bools(input, n)
        });
        let mask = (flags & 4 != 0).then(|| {
            let n = match input.below(4) {
                0 | 1 => len(input, q * s),
                _ => len(input, b * q * s),
            };
            if flags & 8 == 0 {
                Mask::Bool(bools(input, n))
            } else {
                // Two bits per entry pick from a palette of four values.
                let palette = [0.0, f32::NEG_INFINITY, mask_value(input), mask_value(input)];
                let mut byte = 0;
                Mask::Additive(
                    (0..n)
                        .map(|i| {
                            if i % 4 == 0 {
                                byte = input.byte();
                            }
                            palette[usize::from(byte >> (2 * (i % 4)) & 3)]
                        })
                        .collect(),
                )
            }
        });
        Opts {
            key_lengths,
            padding,
            mask,
        }
    }

    fn get(&self) -> AttendOptions<'_> {
        AttendOptions {
            key_lengths: self.key_lengths.as_deref(),
            key_padding_mask: self.padding.as_deref(),
            mask: self.mask.as_ref().map(|m| match m {
                Mask::Bool(m) => AttnMask::Bool(m),
                Mask::Additive(m) => AttnMask::Additive(m),
            }),
            ..AttendOptions::default()
        }
    }

    fn is_none(&self) -> bool {
        self.key_lengths.is_none() && self.padding.is_none() && self.mask.is_none()
    }
}

/// An additive mask value: small, any finite one, huge, or (rarely) NaN or +inf.
fn mask_value(input: &mut Input<'_>) -> f32 {
    match input.below(16) {
        0..=7 => f32::from(input.byte() as i8) / 8.0,
        8..=10 => {
            let v = raw(input);
            if v.is_finite() {
                v
            } else {
                -v.abs()
            }
        }
        11 => f32::MAX,
        12 => f32::MIN,
        13 => -1e30,
        14 => f32::NAN,
        _ => f32::INFINITY,
    }
}

// ---------------------------------------------------------------------------------------------
// The oracle

/// The documented error kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    LengthMismatch,
    KeyLength,
    Dimension,
    MaskValue,
    CacheFull,
    CacheMismatch,
    NeedsCausal,
    /// `Overflow`, `TooLarge` or `AllocationFailed`.
    Size,
}

fn kind(e: &ShapeError) -> Option<Kind> {
    Some(match e {
        ShapeError::LengthMismatch { .. } => Kind::LengthMismatch,
        ShapeError::KeyLength { .. } => Kind::KeyLength,
        ShapeError::DimensionMismatch { .. } => Kind::Dimension,
        ShapeError::MaskValue { .. } => Kind::MaskValue,
        ShapeError::CacheFull { .. } => Kind::CacheFull,
        ShapeError::CacheMismatch => Kind::CacheMismatch,
        ShapeError::DecodeNeedsCausal => Kind::NeedsCausal,
        ShapeError::Overflow { .. }
        | ShapeError::TooLarge
        | ShapeError::AllocationFailed { .. } => Kind::Size,
        _ => return None,
    })
}

/// What a call may return: `Ok` exactly when no rule is broken (`must` is empty), and then
/// also an error of `may`; otherwise an error of `must` or `may`.
#[derive(Default)]
struct Expect {
    must: Vec<Kind>,
    may: Vec<Kind>,
}

impl Expect {
    /// A rule the call breaks when `broken`.
    fn rule(&mut self, broken: bool, kind: Kind) {
        if broken {
            self.must.push(kind);
        }
    }

    /// The rules of the options for `b` sequences of `q` queries over `s` keys.
    fn options(&mut self, opts: &Opts, b: usize, q: usize, s: usize) {
        if let Some(lengths) = &opts.key_lengths {
            self.rule(lengths.len() != b, Kind::LengthMismatch);
            self.rule(lengths.iter().any(|&l| l > s), Kind::KeyLength);
        }
        if let Some(padding) = &opts.padding {
            self.rule(padding.len() != b * s, Kind::LengthMismatch);
        }
        match &opts.mask {
            None => {}
            Some(mask) => {
                let n = match mask {
                    Mask::Bool(m) => m.len(),
                    Mask::Additive(m) => m.len(),
                };
                self.rule(n != q * s && n != b * q * s, Kind::LengthMismatch);
                if let Mask::Additive(m) = mask {
                    let bad = m.iter().any(|v| v.is_nan() || *v == f32::INFINITY);
                    self.rule(bad, Kind::MaskValue);
                }
            }
        }
    }

    /// The output's shape against the call's `(b, q)`; the weights' size when asked for.
    fn output(&mut self, out: &Out, b: usize, q: usize) {
        self.rule((out.batch, out.len) != (b, q), Kind::Dimension);
        if out.weights {
            // Weights that cannot exist must be refused; a huge buffer may be. A shape with a
            // zero holds nothing, whatever its other sizes.
            let bytes = weights_len(out.weights_shape).and_then(|n| n.checked_mul(4));
            match bytes {
                Some(n) if n <= 1 << 28 => {}
                Some(n) if n <= isize::MAX as usize => self.may.push(Kind::Size),
                _ => self.must.push(Kind::Size),
            }
        }
    }

    fn check(&self, what: &str, result: &Result<(), ShapeError>) {
        match result {
            Ok(()) => assert!(
                self.must.is_empty(),
                "{what}: Ok, but these inputs break rules {:?}",
                self.must
            ),
            Err(e) => {
                assert!(!e.to_string().is_empty());
                let allowed =
                    kind(e).is_some_and(|k| self.must.contains(&k) || self.may.contains(&k));
                assert!(
                    allowed,
                    "{what}: {e:?} ({e}), but the rules broken are {:?} (may also: {:?})",
                    self.must, self.may
                );
            }
        }
    }
}

/// The number of attention weights of `shape`: 0 when a size is 0, whatever the others (a
/// shape like `[1, usize::MAX, 2, 0]` is a real, empty result), else the product of the sizes;
/// `None` when it overflows.
fn weights_len(shape: [usize; 4]) -> Option<usize> {
    match shape.contains(&0) {
        true => Some(0),
        false => shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)),
    }
}

/// Where a call writes: an output of `(batch, len)` and, when asked, weights expected to be
/// `weights_shape`.
#[derive(Clone, Copy)]
struct Out {
    batch: usize,
    len: usize,
    weights: bool,
    weights_shape: [usize; 4],
}

impl Out {
    /// The output for a call of `b` sequences of `q` queries over `s` keys with `h` heads:
    /// usually the right shape.
    fn new(input: &mut Input<'_>, b: usize, q: usize, s: usize, h: usize) -> Out {
        let choice = input.byte();
        let (batch, len) = match choice & 0xf {
            15 => (input.below(4), q),
            14 => (b, length(input, MAX_LEN)),
            _ => (b, q),
        };
        Out {
            batch,
            len,
            weights: choice & 0x30 == 0x30,
            weights_shape: [b, h, q, s],
        }
    }
}

/// What one call gave: compared across the thread counts.
#[derive(Debug)]
struct Record {
    what: &'static str,
    result: Result<(), ShapeError>,
    /// The output bits, when `Ok`.
    out: Vec<u32>,
    /// The weights' shape and bits, when `Ok` and asked for.
    weights: Option<([usize; 4], Vec<u32>)>,
    /// The cache's length after a decoding step.
    cache_len: Option<usize>,
}

impl Record {
    /// Equal, the output and weight bits compared by [`same_bits`].
    fn same(&self, other: &Record) -> bool {
        let weights = match (&self.weights, &other.weights) {
            (Some((sa, wa)), Some((sb, wb))) => sa == sb && same_bits(wa, wb),
            (None, None) => true,
            _ => false,
        };
        self.what == other.what
            && self.result == other.result
            && self.cache_len == other.cache_len
            && same_bits(&self.out, &other.out)
            && weights
    }
}

/// Equal bits, NaN payloads included.
fn same_bits(a: &[u32], b: &[u32]) -> bool {
    a == b
}

/// Runs one `_into` call into a fresh output (filled with [`SENTINEL`]) and checks the
/// `Ok`/`Err` oracle and, when `Ok` and `tame`, the output and weights.
fn call<const D: usize>(
    what: &'static str,
    out: Out,
    expect: &Expect,
    tame: bool,
    run: impl FnOnce(Output<'_>) -> Result<(), ShapeError>,
) -> Record {
    let mut buffer = vec![f32::from_bits(SENTINEL); out.batch * out.len * D];
    let mut weights = AttentionWeights::new();
    let output = Output::new(&mut buffer, out.batch, out.len, D).expect("an output of its length");
    let output = if out.weights {
        output.with_weights(&mut weights)
    } else {
        output
    };
    let result = run(output);
    expect.check(what, &result);
    if result.is_err() {
        return Record {
            what,
            result,
            out: Vec::new(),
            weights: None,
            cache_len: None,
        };
    }
    if out.weights {
        assert_eq!(weights.shape(), out.weights_shape, "{what}: weights shape");
        let n = weights_len(out.weights_shape).expect("an Ok call's weights have a size");
        assert_eq!(weights.as_slice().len(), n, "{what}: weights length");
    }
    if tame {
        if let Some(i) = buffer.iter().position(|v| !v.is_finite()) {
            panic!("{what}: output {i} is {} for finite input", buffer[i]);
        }
        if out.weights {
            let s = out.weights_shape[3];
            for (r, row) in weights.as_slice().chunks(s.max(1)).enumerate() {
                let sum: f32 = row.iter().sum();
                assert!(
                    row.iter().all(|w| (0.0..=1.0).contains(w))
                        && (sum == 0.0 && row.iter().all(|&w| w == 0.0)
                            || (sum - 1.0).abs() <= 1e-3),
                    "{what}: weights row {r} is {row:?} for finite input"
                );
            }
        }
    }
    Record {
        what,
        result,
        out: buffer.iter().map(|v| v.to_bits()).collect(),
        weights: out.weights.then(|| {
            (
                weights.shape(),
                weights.as_slice().iter().map(|v| v.to_bits()).collect(),
            )
        }),
        cache_len: None,
    }
}

// ---------------------------------------------------------------------------------------------
// Layers

/// A head count: usually a divisor of `d` (any count for `d = 0`), else any byte, 0, `d + 1`
/// or `usize::MAX`.
fn head_count(input: &mut Input<'_>, d: usize) -> usize {
    match input.below(8) {
        0..=4 => {
            let divisors: Vec<usize> = (1..=d.max(1)).filter(|&h| d.is_multiple_of(h)).collect();
            divisors[input.below(divisors.len())]
        }
        5 | 6 => usize::from(input.byte()),
        _ => [0, d + 1, usize::MAX][input.below(3)],
    }
}

/// An instruction set: usually a supported one, now and then any.
fn isa(input: &mut Input<'_>) -> Isa {
    let supported: Vec<Isa> = Isa::ALL.into_iter().filter(|i| i.is_supported()).collect();
    match input.below(16) {
        0 => Isa::detect(),
        15 => Isa::ALL[input.below(Isa::ALL.len())],
        n => supported[n % supported.len()],
    }
}

/// What building a layer of `n_heads` for `isa` must give: the errors it may return (empty:
/// it must be `Ok`), each with its numbers, and otherwise `(head_dim, n_kv_heads)`.
fn build_rules<const D: usize, const KV: usize>(
    n_heads: usize,
    isa: Isa,
) -> (Vec<ShapeError>, Option<(usize, usize)>) {
    let mut errors = Vec::new();
    let mut shape = None;
    if n_heads == 0 {
        errors.push(ShapeError::ZeroHeads);
    } else if !D.is_multiple_of(n_heads) {
        errors.push(ShapeError::NotDivisible {
            d_model: D,
            n_heads,
        });
    } else {
        let head_dim = D / n_heads;
        // Zero-width heads: every head has its own (empty) keys and values.
        let n_kv = KV.checked_div(head_dim).unwrap_or(n_heads);
        if n_kv == 0 || n_kv * head_dim != KV || !n_heads.is_multiple_of(n_kv) {
            errors.push(ShapeError::KvHeads {
                kv_width: KV,
                head_dim,
                n_heads,
            });
        } else {
            shape = Some((head_dim, n_kv));
        }
    }
    if !isa.is_supported() {
        errors.push(ShapeError::UnsupportedIsa { isa: isa.name() });
    }
    if !errors.is_empty() {
        shape = None;
    }
    (errors, shape)
}

/// A layer's weights and settings, from the bytes.
struct Setup<const D: usize, const E: usize, const KV: usize> {
    params: MhaParams<D, E, KV>,
    biases: MhaBiases<D, KV>,
    n_heads: usize,
    masking: Masking,
    isa: Isa,
    /// Whether the weights and biases are all tame.
    tame: bool,
}

impl<const D: usize, const E: usize, const KV: usize> Setup<D, E, KV> {
    fn new(input: &mut Input<'_>) -> Self {
        let n_heads = head_count(input, D);
        let masking = if input.below(4) == 3 {
            Masking::Bidirectional
        } else {
            Masking::Causal
        };
        let isa = isa(input);
        let matrix = |input: &mut Input<'_>, rows: usize, cols: usize| values(input, rows * cols);
        let [wq, wk, wv, wo] = [(D, D), (E, KV), (E, KV), (D, D)].map(|(r, c)| matrix(input, r, c));
        let which = input.byte();
        let bias = |input: &mut Input<'_>, bit: u8, n: usize| {
            (which >> bit & 1 == 1).then(|| values(input, n))
        };
        let [bq, bk, bv, bo] =
            [(0, D), (1, KV), (2, KV), (3, D)].map(|(bit, n)| bias(input, bit, n));
        let tame = [&wq, &wk, &wv, &wo].iter().all(|w| tame(w))
            && [&bq, &bk, &bv, &bo]
                .iter()
                .all(|b| b.as_deref().is_none_or(tame));
        Setup {
            params: MhaParams::from_parts(
                Matrix::from_vec(wq).unwrap(),
                Matrix::from_vec(wk).unwrap(),
                Matrix::from_vec(wv).unwrap(),
                Matrix::from_vec(wo).unwrap(),
            ),
            biases: MhaBiases {
                bq: bq.map(|b| Matrix::from_vec(b).unwrap()),
                bk: bk.map(|b| Matrix::from_vec(b).unwrap()),
                bv: bv.map(|b| Matrix::from_vec(b).unwrap()),
                bo: bo.map(|b| Matrix::from_vec(b).unwrap()),
            },
            n_heads,
            masking,
            isa,
            tame,
        }
    }

    /// The layer on `threads` threads, checked against [`build_rules`].
    fn build(&self, threads: usize) -> Option<Mha<D, E, KV>> {
        let built = Mha::builder(&self.params, self.n_heads)
            .masking(self.masking)
            .biases(self.biases.clone())
            .threads(threads)
            .min_work_per_thread(0)
            .isa(self.isa)
            .build();
        let (errors, shape) = build_rules::<D, KV>(self.n_heads, self.isa);
        match built {
            Ok(layer) => {
                let (head_dim, n_kv) = shape.unwrap_or_else(|| {
                    panic!(
                        "built with {} heads on {:?}, expected {errors:?}",
                        self.n_heads, self.isa
                    )
                });
                assert_eq!(layer.n_heads(), self.n_heads);
                assert_eq!(layer.n_kv_heads(), n_kv);
                assert_eq!(layer.head_dim(), head_dim);
                assert_eq!(layer.threads(), threads);
                assert_eq!(layer.masking(), self.masking);
                assert_eq!(layer.isa(), self.isa);
                Some(layer)
            }
            Err(e) => {
                assert!(
                    errors.contains(&e),
                    "build with {} heads on {:?}: {e:?}, expected {errors:?}",
                    self.n_heads,
                    self.isa
                );
                None
            }
        }
    }

    /// The three layers (1, 2 and 3 threads), or `None` when the settings are refused.
    fn layers(&self) -> Option<[Mha<D, E, KV>; 3]> {
        if std::env::var_os("LAYER_API_DEBUG").is_some() {
            eprintln!(
                "D {D}, E {E}, KV {KV}, {} heads, {:?}, {:?}, tame weights {}, biases {:?}",
                self.n_heads,
                self.masking,
                self.isa,
                self.tame,
                [
                    self.biases.bq.is_some(),
                    self.biases.bk.is_some(),
                    self.biases.bv.is_some(),
                    self.biases.bo.is_some()
                ]
            );
        }
        let [a, b, c] = [1, 2, 3].map(|t| self.build(t));
        Some([a?, b?, c?])
    }
}

/// Asserts that every layer gave the same records as the one-thread layer. With
/// `LAYER_API_DEBUG` set, first prints the one-thread layer's calls.
fn same_records(sessions: &[Vec<Record>]) {
    let first = &sessions[0];
    if std::env::var_os("LAYER_API_DEBUG").is_some() {
        for r in first {
            let cache = r
                .cache_len
                .map(|l| format!(", cache {l}"))
                .unwrap_or_default();
            eprintln!("{}: {:?}, {} outputs{cache}", r.what, r.result, r.out.len());
        }
    }
    for (i, other) in sessions.iter().enumerate().skip(1) {
        assert_eq!(
            first.len(),
            other.len(),
            "{} threads: another number of calls",
            i + 1
        );
        for (a, b) in first.iter().zip(other) {
            if a.same(b) {
                continue;
            }
            let at = a
                .out
                .iter()
                .zip(&b.out)
                .position(|(x, y)| !same_bits(&[*x], &[*y]));
            panic!(
                "{}: 1 thread and {} threads differ: {:?} vs {:?}, first differing output {at:?} \
                 ({:?} vs {:?}), cache {:?} vs {:?}, weights equal: {}",
                a.what,
                i + 1,
                a.result,
                b.result,
                at.map(|i| a.out[i]),
                at.map(|i| b.out[i]),
                a.cache_len,
                b.cache_len,
                a.weights == b.weights
            );
        }
    }
}

/// The run-time constructors against their rule: `Ok` exactly when the buffer holds
/// `batch · len · D` values, else `LengthMismatch`.
fn constructors<const D: usize>(input: &mut Input<'_>, x: &Seq) {
    let (batch, len) = (input.below(4), length(input, MAX_LEN));
    let fits = batch * len * D == x.data.len();
    let tokens = Tokens::new(&x.data, batch, len, D);
    match &tokens {
        Ok(t) => assert!(fits && (t.batch(), t.len()) == (batch, len)),
        Err(e) => assert!(
            !fits && matches!(e, ShapeError::LengthMismatch { .. }),
            "{e:?}"
        ),
    }
    let mut buffer = x.data.clone();
    let output = Output::new(&mut buffer, batch, len, D);
    match &output {
        Ok(o) => assert!(fits && (o.batch(), o.len()) == (batch, len)),
        Err(e) => assert!(
            !fits && matches!(e, ShapeError::LengthMismatch { .. }),
            "{e:?}"
        ),
    }
}

// ---------------------------------------------------------------------------------------------
// Sessions

fn self_attention<const D: usize, const KV: usize>(input: &mut Input<'_>) {
    let setup = Setup::<D, D, KV>::new(input);
    let Some(mut layers) = setup.layers() else {
        return;
    };
    let rest = input.bytes(usize::MAX);
    let sessions: Vec<Vec<Record>> = layers
        .iter_mut()
        .map(|layer| self_session(layer, &setup, rest))
        .collect();
    same_records(&sessions);
}

fn cross_attention<const D: usize, const E: usize, const KV: usize>(input: &mut Input<'_>) {
    let setup = Setup::<D, E, KV>::new(input);
    let Some(mut layers) = setup.layers() else {
        return;
    };
    let rest = input.bytes(usize::MAX);
    let sessions: Vec<Vec<Record>> = layers
        .iter_mut()
        .map(|layer| {
            let mut input = Input::new(rest);
            let (b, t) = (input.below(4), length(&mut input, MAX_LEN));
            let x = Seq::new(&mut input, b, t, D);
            let mut records = Vec::new();
            for _ in 0..=input.below(3) {
                records.push(cross(layer, &mut input, &x, setup.tame));
            }
            records
        })
        .collect();
    same_records(&sessions);
}

/// A cross-attention of `x` over a memory from the bytes.
fn cross<const D: usize, const E: usize, const KV: usize>(
    layer: &mut Mha<D, E, KV>,
    input: &mut Input<'_>,
    x: &Seq,
    tame: bool,
) -> Record {
    let (b, t) = (x.batch, x.len);
    let memory_batch = if input.below(16) == 15 {
        input.below(4)
    } else {
        b
    };
    let s = length(input, MAX_LEN);
    let memory = Seq::new(input, memory_batch, s, E);
    let opts = Opts::new(input, b, t, s);
    let out = Out::new(input, b, t, s, layer.n_heads());
    let mut expect = Expect::default();
    expect.rule(memory_batch != b, Kind::Dimension);
    expect.output(&out, b, t);
    expect.options(&opts, b, t, s);
    let tame = tame && x.tame && memory.tame;
    call::<D>("cross_into", out, &expect, tame, |o| {
        layer.cross_into(x.tokens::<D>(), memory.tokens::<E>(), opts.get(), o)
    })
}

/// The cache of a decoding session and how it relates to the layer.
struct CacheUse {
    cache: KvCache,
    /// Made by a layer with other key/value heads or head width: every step must be refused.
    foreign_shape: bool,
    /// Made for another instruction set: steps may be refused.
    foreign_isa: bool,
}

fn self_session<const D: usize, const KV: usize>(
    layer: &mut Mha<D, D, KV>,
    setup: &Setup<D, D, KV>,
    data: &[u8],
) -> Vec<Record> {
    let mut input = Input::new(data);
    let input = &mut input;
    let h = layer.n_heads();
    let (b, t) = (input.below(4), length(input, MAX_LEN));
    let x = Seq::new(input, b, t, D);
    let tame = setup.tame && x.tame;
    constructors::<D>(input, &x);
    let mut records = Vec::new();

    // The plain forward: no options, the right output. Nothing can be wrong.
    let plain_out = Out {
        batch: b,
        len: t,
        weights: false,
        weights_shape: [b, h, t, t],
    };
    let plain = call::<D>(
        "plain forward_into",
        plain_out,
        &Expect::default(),
        tame,
        |o| layer.forward_into(x.tokens::<D>(), AttendOptions::default(), o),
    );

    // A forward with options.
    let opts = Opts::new(input, b, t, t);
    let out = Out::new(input, b, t, t, h);
    let mut expect = Expect::default();
    expect.output(&out, b, t);
    expect.options(&opts, b, t, t);
    records.push(call::<D>("forward_into", out, &expect, tame, |o| {
        layer.forward_into(x.tokens::<D>(), opts.get(), o)
    }));

    // Cross-attention, memory of width D.
    records.push(cross(layer, input, &x, setup.tame));

    // Decoding x in chunks.
    let cache_batch = if input.below(16) == 15 {
        input.below(4)
    } else {
        b
    };
    let capacity = input.below(MAX_CAPACITY + 1);
    let mut cache = cache_for(layer, setup, input, cache_batch, capacity);
    for _ in 0..input.below(9) {
        let before = cache.cache.len();
        if input.below(16) == 15 {
            cache.cache.clear();
            assert!(cache.cache.is_empty() && cache.cache.capacity() == capacity);
            continue;
        }
        let pos = before.min(t);
        let l = match input.below(4) {
            0 => 1,
            1 => input.below(4),
            2 => input.below(17),
            _ => input.below(MAX_LEN + 1),
        }
        .min(t - pos);
        let chunk = x.rows::<D>(pos, l);
        let s = before + l;
        let opts = if input.below(4) == 3 {
            Opts::new(input, b, l, s)
        } else {
            Opts::default()
        };
        let out = Out::new(input, b, l, s, h);
        let mut expect = Expect::default();
        expect.rule(setup.masking != Masking::Causal, Kind::NeedsCausal);
        expect.output(&out, b, l);
        expect.rule(cache.foreign_shape, Kind::CacheMismatch);
        if cache.foreign_isa {
            expect.may.push(Kind::CacheMismatch);
        }
        expect.rule(cache_batch != b, Kind::Dimension);
        // A batch of no sequences stores nothing: no capacity to pass.
        expect.rule(b > 0 && s > capacity, Kind::CacheFull);
        expect.options(&opts, b, l, s);
        let mut record = call::<D>("decode_into", out, &expect, tame, |o| {
            layer.decode_into(chunk.tokens::<D>(), &mut cache.cache, opts.get(), o)
        });
        let after = cache.cache.len();
        if record.result.is_ok() {
            // The cache's length is its longest sequence's: a batch of none stays at 0.
            let appended = if b == 0 { 0 } else { l };
            assert_eq!(after, before + appended, "an Ok step appends its tokens");
            if opts.is_none() && plain.result.is_ok() && before == pos {
                decode_equals_forward::<D>(&record, &plain, b, t, pos, l);
            }
        } else {
            assert_eq!(
                after, before,
                "{:?} leaves the cache as it was",
                record.result
            );
        }
        record.cache_len = Some(after);
        records.push(record);
    }
    let _ = format!("{:?}", cache.cache);

    // The plain forward again: the calls between leave nothing behind.
    let again = call::<D>(
        "plain forward_into",
        plain_out,
        &Expect::default(),
        tame,
        |o| layer.forward_into(x.tokens::<D>(), AttendOptions::default(), o),
    );
    assert!(
        again.same(&plain),
        "the plain forward changed after other calls"
    );
    records.push(plain);
    records
}

/// A cache of `batch × capacity` for `layer`, now and then made by another layer of the same
/// width (other heads, another instruction set).
fn cache_for<const D: usize, const KV: usize>(
    layer: &Mha<D, D, KV>,
    setup: &Setup<D, D, KV>,
    input: &mut Input<'_>,
    batch: usize,
    capacity: usize,
) -> CacheUse {
    let mut maker = None;
    if input.below(8) == 7 {
        let n_heads = head_count(input, D);
        let isa = isa(input);
        maker = Mha::builder(&setup.params, n_heads)
            .threads(1)
            .isa(isa)
            .build()
            .ok();
    }
    let made = match &maker {
        Some(other) => other.new_cache(batch, capacity),
        None => layer.new_cache(batch, capacity),
    };
    let cache = made.unwrap_or_else(|e| panic!("new_cache({batch}, {capacity}): {e:?}"));
    // `len` and `is_empty` are the calls under test here.
    #[allow(clippy::len_zero)]
    let empty = cache.is_empty() && cache.len() == 0;
    assert!(empty);
    assert_eq!((cache.batch(), cache.capacity()), (batch, capacity));
    let (foreign_shape, foreign_isa) = match &maker {
        Some(other) => (
            (other.n_kv_heads(), other.head_dim()) != (layer.n_kv_heads(), layer.head_dim()),
            other.isa() != layer.isa(),
        ),
        None => (false, false),
    };
    CacheUse {
        cache,
        foreign_shape,
        foreign_isa,
    }
}

/// The rows a decoding step of tokens `pos .. pos + l` wrote are those of the plain forward.
fn decode_equals_forward<const D: usize>(
    step: &Record,
    plain: &Record,
    b: usize,
    t: usize,
    pos: usize,
    l: usize,
) {
    for batch in 0..b {
        let got = &step.out[batch * l * D..][..l * D];
        let want = &plain.out[(batch * t + pos) * D..][..l * D];
        if !same_bits(got, want) {
            let i = (0..got.len())
                .position(|i| !same_bits(&got[i..=i], &want[i..=i]))
                .unwrap();
            panic!(
                "decoding tokens {pos}..{} (batch element {batch}) differs from the forward at \
                 token {}, feature {}: {:#010x} vs {:#010x}",
                pos + l,
                pos + i / D.max(1),
                i % D.max(1),
                got[i],
                want[i]
            );
        }
    }
}
