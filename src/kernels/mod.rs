//! The kernel layer: slices with run-time dimensions, one set of microkernels per instruction
//! set, and the one place where the instruction set is chosen.
//!
//! The run-time core ([`Layer`](crate::Layer)) and the typed front above it check shapes and
//! call into this layer, which imports nothing from them:
//!
//! - [`gemm()`]: `C = A · B` in the BLIS shape (packed panels, cache blocking, a register-blocked
//!   microkernel), with `B` packed once ([`PackedB`]).
//! - `flash`: attention in the FlashAttention-2 shape (online softmax over key blocks), causal
//!   or not, with key lengths, padding and masks (`mask`).
//! - [`exp`]: the crate's own accurate `exp`, scalar and vectorised.
//! - [`trig`]: the crate's own `sin` and `cos` (in `f64`, for the rotary angles).
//! - [`tanh`]: the crate's own `tanh` and logit soft-capping, scalar and vectorised.
//!
//! Each instruction set provides the same small `Kernels` table: a GEMM microtile and its
//! one-row `gemv` (also across packed panels), the online-softmax steps for a block and for
//! one row, a block transpose, the soft cap, a prefetch and the widening of 16- and 8-bit keys
//! and values, each the one generic kernel (`micro.rs`, `softmax.rs`, `transpose.rs`,
//! `tanh.rs`, `widen.rs`) instantiated for the instruction
//! set's primitives (`simd.rs`; `portable.rs`, `avx2.rs`, `avx512.rs`, `neon.rs`).
//! [`Isa::detect`] picks the widest one this CPU runs, once.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod blocking;
pub(crate) mod buffer;
pub(crate) mod elements;
pub mod exp;
pub(crate) mod flash;
pub mod gemm;
pub(crate) mod kv;
pub(crate) mod layout;
pub(crate) mod mask;
pub(crate) mod micro;
pub(crate) mod narrow;
#[cfg(target_arch = "aarch64")]
mod neon;
pub(crate) mod packed;
pub(crate) mod parallel;
pub(crate) mod plan;
#[cfg(feature = "std")]
mod pool;
mod portable;
mod simd;
mod softmax;
pub mod tanh;
pub(crate) mod terms;
mod transpose;
pub mod trig;
#[cfg(all(test, feature = "std"))]
mod ulp;
pub(crate) mod weights;
pub(crate) mod widen;

pub use gemm::gemm;
pub use narrow::{KvFormat, WeightFormat};
pub use packed::PackedB;
#[cfg(feature = "std")]
pub use parallel::Executor;
#[cfg(feature = "std")]
pub use pool::ThreadPool;

use core::sync::atomic::{AtomicU8, Ordering};

use crate::error::ShapeError;

/// An instruction set the kernels are compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Isa {
    /// Plain Rust loops that LLVM vectorises for the build's baseline target; runs everywhere.
    Portable,
    /// x86-64 AVX2 with FMA (256-bit vectors).
    Avx2,
    /// x86-64 AVX-512F (512-bit vectors).
    Avx512,
    /// AArch64 NEON (128-bit vectors; every AArch64 CPU has it).
    Neon,
}

impl Isa {
    /// Every instruction set: the portable one, then each architecture's, narrowest first.
    pub const ALL: [Isa; 4] = [Isa::Portable, Isa::Avx2, Isa::Avx512, Isa::Neon];

    /// The name used by the `MHA_ISA` environment variable: `portable`, `avx2`, `avx512` or
    /// `neon`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
        }
    }

    /// Whether this CPU (and the operating system, which must save the wider registers) can
    /// run the instruction set (`Avx2` is AVX2 with FMA and F16C, the binary16 conversions;
    /// `Avx512` includes those, which the table also uses).
    ///
    /// With feature `std` this asks `std::is_x86_feature_detected!`; without it, `cpuid` and
    /// `xgetbv` directly, so a `no_std` build still gets SIMD. `Neon` is supported on every
    /// AArch64 CPU and nowhere else; `Portable` everywhere.
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(all(target_arch = "x86_64", feature = "std"))]
            Isa::Avx2 => {
                std::is_x86_feature_detected!("avx2")
                    && std::is_x86_feature_detected!("fma")
                    && std::is_x86_feature_detected!("f16c")
            }
            #[cfg(all(target_arch = "x86_64", feature = "std"))]
            Isa::Avx512 => std::is_x86_feature_detected!("avx512f") && Isa::Avx2.is_supported(),
            #[cfg(all(target_arch = "x86_64", not(feature = "std")))]
            Isa::Avx2 | Isa::Avx512 => cpuid::supports(self),
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 | Isa::Avx512 => false,
            Isa::Neon => cfg!(target_arch = "aarch64"),
        }
    }

    /// The instruction set the crate uses by default, resolved on first use and cached.
    ///
    /// The widest supported one, unless (with feature `std`) the environment variable
    /// `MHA_ISA` names a supported one (`portable`, `avx2`, `avx512` or `neon`). A name that is unknown
    /// or not supported here is not silently ignored: the first call writes
    /// `mha: MHA_ISA ...; using <isa>` to standard error and runs the widest supported table;
    /// [`Isa::from_env`] returns the same error to a program that wants to stop instead.
    pub fn detect() -> Isa {
        static CHOSEN: AtomicU8 = AtomicU8::new(u8::MAX);
        let cached = CHOSEN.load(Ordering::Relaxed);
        if let Some(&isa) = Isa::ALL.get(usize::from(cached)) {
            return isa;
        }
        let requested = Isa::from_env();
        let isa = match requested {
            Ok(Some(isa)) => isa,
            Ok(None) | Err(_) => Isa::widest_supported(),
        };
        let index = Isa::ALL.iter().position(|&i| i == isa).unwrap_or(0);
        if CHOSEN.swap(index as u8, Ordering::Relaxed) == u8::MAX {
            Isa::report_ignored_request(requested.err(), isa);
        }
        isa
    }

    /// The widest instruction set this CPU supports.
    fn widest_supported() -> Isa {
        Isa::ALL
            .into_iter()
            .rev()
            .find(|isa| isa.is_supported())
            .unwrap_or(Isa::Portable)
    }

    /// Writes why `MHA_ISA` was not honoured to standard error (with `std`; a no-op without).
    fn report_ignored_request(error: Option<ShapeError>, used: Isa) {
        #[cfg(feature = "std")]
        if let Some(error) = error {
            std::eprintln!("mha: {error}; using {}", used.name());
        }
        #[cfg(not(feature = "std"))]
        let _ = (error, used);
    }

    /// The instruction set named `name` (`portable`, `avx2` or `avx512`, any case, surrounding
    /// spaces ignored), if this CPU supports it.
    ///
    /// # Errors
    /// [`ShapeError::Setting`] naming the text when it names no instruction set;
    /// [`ShapeError::UnsupportedIsa`] when it names one this CPU cannot run.
    ///
    /// ```
    /// use mha::Isa;
    /// assert_eq!(Isa::from_name(" Portable ")?, Isa::Portable);
    /// assert_eq!(
    ///     Isa::from_name("avx").unwrap_err().to_string(),
    ///     "MHA_ISA is \"avx\", but must be one of portable, avx2, avx512, neon"
    /// );
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    pub fn from_name(name: &str) -> Result<Isa, ShapeError> {
        let isa = Isa::ALL
            .into_iter()
            .find(|isa| isa.name().eq_ignore_ascii_case(name.trim()))
            .ok_or_else(|| ShapeError::Setting {
                what: "MHA_ISA",
                value: alloc::format!("{name:?}"),
                expected: "one of portable, avx2, avx512, neon",
            })?;
        if !isa.is_supported() {
            return Err(ShapeError::UnsupportedIsa { isa: isa.name() });
        }
        Ok(isa)
    }

    /// The instruction set the environment variable `MHA_ISA` asks for: `Ok(None)` when it is
    /// unset (and always without feature `std`), else [`Isa::from_name`] of its value.
    ///
    /// # Errors
    /// As [`Isa::from_name`]; a value that is not UTF-8 is a [`ShapeError::Setting`].
    pub fn from_env() -> Result<Option<Isa>, ShapeError> {
        #[cfg(feature = "std")]
        {
            match std::env::var("MHA_ISA") {
                Err(std::env::VarError::NotPresent) => Ok(None),
                Err(std::env::VarError::NotUnicode(value)) => Err(ShapeError::Setting {
                    what: "MHA_ISA",
                    value: alloc::format!("{value:?}"),
                    expected: "one of portable, avx2, avx512, neon",
                }),
                Ok(name) => Isa::from_name(&name).map(Some),
            }
        }
        #[cfg(not(feature = "std"))]
        {
            Ok(None)
        }
    }

    /// The kernel table of this instruction set.
    ///
    /// # Errors
    /// [`ShapeError::UnsupportedIsa`] when this CPU cannot run it.
    pub(crate) fn kernels(self) -> Result<&'static Kernels, ShapeError> {
        match self {
            Isa::Portable => Ok(&portable::KERNELS),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 if self.is_supported() => Ok(&avx2::KERNELS),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 if self.is_supported() => Ok(&avx512::KERNELS),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => Ok(&neon::KERNELS),
            _ => Err(ShapeError::UnsupportedIsa { isa: self.name() }),
        }
    }
}

/// CPU-feature detection without `std`, straight from `cpuid` and `xgetbv` (also compiled for the
/// tests, which compare it with `std::is_x86_feature_detected!`).
#[cfg(all(target_arch = "x86_64", any(not(feature = "std"), test)))]
mod cpuid {
    use core::arch::x86_64::{__cpuid_count, _xgetbv, CpuidResult};

    use super::Isa;

    /// `cpuid` leaf 1, ECX: FMA.
    const FMA: u32 = 1 << 12;
    /// `cpuid` leaf 1, ECX: F16C (binary16 conversions).
    const F16C: u32 = 1 << 29;
    /// `cpuid` leaf 1, ECX: the OS enabled `xgetbv` (and XSAVE-managed state).
    const OSXSAVE: u32 = 1 << 27;
    /// `cpuid` leaf 1, ECX: AVX.
    const AVX: u32 = 1 << 28;
    /// `cpuid` leaf 7.0, EBX: AVX2.
    const AVX2: u32 = 1 << 5;
    /// `cpuid` leaf 7.0, EBX: AVX-512 Foundation.
    const AVX512F: u32 = 1 << 16;
    /// XCR0: the OS saves SSE (XMM) and AVX (upper YMM) state.
    const XCR0_YMM: u64 = 0b110;
    /// XCR0: the OS also saves the opmask registers, the upper ZMM halves and ZMM16..31.
    const XCR0_ZMM: u64 = XCR0_YMM | 0b1110_0000;

    /// `cpuid` with a sub-leaf.
    fn cpuid(leaf: u32, sub_leaf: u32) -> CpuidResult {
        // SAFETY: every x86-64 CPU has `cpuid`. (The intrinsic is safe in newer Rust versions,
        // hence the allow.)
        #[allow(unused_unsafe)]
        unsafe {
            __cpuid_count(leaf, sub_leaf)
        }
    }

    /// Whether the CPU has the features of `isa` and the OS saves its registers.
    pub(super) fn supports(isa: Isa) -> bool {
        let max_leaf = cpuid(0, 0).eax;
        let leaf1 = cpuid(1, 0).ecx;
        if max_leaf < 7 || leaf1 & (OSXSAVE | AVX) != OSXSAVE | AVX {
            return false;
        }
        // SAFETY: OSXSAVE is set, so the OS enabled `xgetbv`; XCR0 always exists.
        let xcr0 = unsafe { _xgetbv(0) };
        let leaf7 = cpuid(7, 0).ebx;
        match isa {
            Isa::Portable => true,
            Isa::Neon => false,
            Isa::Avx2 => {
                leaf1 & (FMA | F16C) == FMA | F16C
                    && leaf7 & AVX2 != 0
                    && xcr0 & XCR0_YMM == XCR0_YMM
            }
            Isa::Avx512 => {
                leaf7 & AVX512F != 0 && xcr0 & XCR0_ZMM == XCR0_ZMM && supports(Isa::Avx2)
            }
        }
    }
}

/// The kernel unit tests' one source of values: `n` values in [-1, 1) from a fixed linear
/// congruential sequence started at `seed`.
#[cfg(test)]
pub(crate) fn test_values(n: usize, seed: u32) -> alloc::vec::Vec<f32> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (x >> 8) as f32 / (1 << 23) as f32 - 1.0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::test_values as values;
    use alloc::format;
    use alloc::vec::Vec;

    use super::Isa;

    #[cfg(all(target_arch = "x86_64", feature = "std"))]
    #[test]
    fn cpuid_detection_agrees_with_std() {
        for isa in Isa::ALL {
            assert_eq!(super::cpuid::supports(isa), isa.is_supported(), "{isa:?}");
        }
    }

    /// A row computed by `gemv` has the bits of the same row computed by `tile`, for every
    /// width (vector tails included), strided operands, with and without accumulation.
    #[test]
    fn gemv_matches_tile_rows_bit_for_bit() {
        for isa in Isa::ALL.into_iter().filter(|isa| isa.is_supported()) {
            let kernels = isa.kernels().unwrap();
            let (mr, nr) = (kernels.mr, kernels.nr);
            for k in [0, 1, 5, 64, 100] {
                for accumulate in [false, true] {
                    let (lda, ldb, ldc) = (mr + 2, nr + 3, nr + 1);
                    let a = values(k.max(1) * lda, 6);
                    let b = values(k.max(1) * ldb + nr, 7);
                    let mut c = values(mr * ldc, 8);
                    let start = c.clone();
                    // SAFETY: checked table; the operands have the documented lengths.
                    unsafe { (kernels.tile)(k, &a, lda, &b, ldb, &mut c, ldc, accumulate) };
                    for i in 0..mr {
                        let a_row: Vec<f32> = (0..k).map(|p| a[p * lda + i]).collect();
                        for width in [1, nr / 2 + 1, nr] {
                            let mut row = start[i * ldc..][..width].to_vec();
                            // SAFETY: as above.
                            unsafe { (kernels.gemv)(k, &a_row, &b, ldb, &mut row, accumulate) };
                            let got: Vec<u32> = row.iter().map(|x| x.to_bits()).collect();
                            let want: Vec<u32> =
                                c[i * ldc..][..width].iter().map(|x| x.to_bits()).collect();
                            assert_eq!(got, want, "{isa:?} k {k} row {i} width {width}");
                        }
                    }
                }
            }
        }
    }

    /// `values`, with about one in five replaced by a NaN (both signs, several payloads), an
    /// infinity or a signed zero, so that `inf · 0` makes NaNs as well.
    fn values_with_specials(n: usize, seed: u32) -> Vec<f32> {
        const SPECIALS: [u32; 8] = [
            0x7fc0_0000,
            0xffc0_0000,
            0x7fc1_2345,
            0xff80_0001,
            0x7f80_0000,
            0xff80_0000,
            0x0000_0000,
            0x8000_0000,
        ];
        let mut x = seed;
        values(n, seed)
            .into_iter()
            .map(|v| {
                x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                match x >> 24 {
                    r if r % 5 == 0 => f32::from_bits(SPECIALS[(r / 5) as usize % 8]),
                    _ => v,
                }
            })
            .collect()
    }

    /// On inputs with NaNs, infinities and zeros, `tile`, `gemv` and `gemv_panels` give the
    /// same bits for a row, NaN payloads included (every NaN stored is `f32::NAN`), and a chain
    /// split between a tile and `gemv` is still the chain of one tile.
    #[test]
    fn tile_and_gemv_agree_on_nan_payloads() {
        for isa in Isa::ALL.into_iter().filter(|isa| isa.is_supported()) {
            let kernels = isa.kernels().unwrap();
            let (mr, nr) = (kernels.mr, kernels.nr);
            for (k, k1) in [(0, 0), (1, 0), (5, 2), (64, 13), (100, 99)] {
                for accumulate in [false, true] {
                    let seed = (k * 2 + usize::from(accumulate)) as u32;
                    let ldc = nr + 1;
                    let a = values_with_specials(k.max(1) * mr, 40 + seed);
                    let b = values_with_specials(k.max(1) * nr, 41 + seed);
                    let start = values_with_specials(mr * ldc, 42 + seed);
                    let mut whole = start.clone();
                    let mut split = start.clone();
                    // SAFETY: checked table; the panels hold k·mr and k·nr values, the tile
                    // (mr-1)·ldc + nr.
                    unsafe {
                        (kernels.tile)(k, &a, mr, &b, nr, &mut whole, ldc, accumulate);
                        (kernels.tile)(k1, &a, mr, &b, nr, &mut split, ldc, accumulate);
                    }
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
                    let canonical = f32::NAN.to_bits();
                    for i in 0..mr {
                        let context = format!("{isa:?} k {k} accumulate {accumulate} row {i}");
                        let want = bits(&whole[i * ldc..][..nr]);
                        assert!(
                            want.iter()
                                .all(|&x| !f32::from_bits(x).is_nan() || x == canonical),
                            "{context}: tile stored a NaN other than f32::NAN"
                        );
                        let a_row: Vec<f32> = (0..k).map(|p| a[p * mr + i]).collect();
                        for width in [1, nr / 2 + 1, nr] {
                            let mut row = start[i * ldc..][..width].to_vec();
                            let mut panel_row = row.clone();
                            // SAFETY: as above; one panel of k steps.
                            unsafe {
                                (kernels.gemv)(k, &a_row, &b, nr, &mut row, accumulate);
                                (kernels.gemv_panels)(
                                    k,
                                    &a_row,
                                    super::micro::Panels::F32(&b),
                                    k * nr,
                                    &mut panel_row,
                                    accumulate,
                                );
                            }
                            assert_eq!(bits(&row), want[..width], "{context} width {width}");
                            assert_eq!(bits(&panel_row), want[..width], "{context} panels");
                        }
                        let rest = &mut split[i * ldc..][..nr];
                        // SAFETY: as above; `b` from step k1 holds (k-k1-1)·nr + nr values.
                        unsafe {
                            (kernels.gemv)(
                                k - k1,
                                &a_row[k1..],
                                &b[k1 * nr..],
                                nr,
                                rest,
                                accumulate || k1 > 0,
                            )
                        };
                        assert_eq!(bits(rest), want, "{context}: tile to step {k1}, then gemv");
                    }
                }
            }
        }
    }

    /// `gemv` on every width up to past two 64-column chunks, against the scalar chain it
    /// promises: fused on the FMA instruction sets, separately rounded on the portable one.
    #[cfg(feature = "std")]
    #[test]
    fn gemv_matches_the_scalar_chain_on_every_width() {
        for isa in Isa::ALL.into_iter().filter(|isa| isa.is_supported()) {
            let kernels = isa.kernels().unwrap();
            for k in [0, 1, 3, 17] {
                for width in 0..150 {
                    for accumulate in [false, true] {
                        let ldb = width + 7;
                        let a = values(k, 20);
                        let b = values(k.max(1) * ldb, 21);
                        let start = values(width, 22);
                        let mut got = start.clone();
                        // SAFETY: checked table; `a` holds k values, `b` (k-1)·ldb + width.
                        unsafe { (kernels.gemv)(k, &a, &b, ldb, &mut got, accumulate) };
                        for j in 0..width {
                            let mut want = if accumulate { start[j] } else { 0.0 };
                            for p in 0..k {
                                want = match isa {
                                    Isa::Portable => want + a[p] * b[p * ldb + j],
                                    _ => a[p].mul_add(b[p * ldb + j], want),
                                };
                            }
                            let context = format!("{isa:?} k {k} width {width} column {j}");
                            assert_eq!(got[j].to_bits(), want.to_bits(), "{context}");
                        }
                    }
                }
            }
        }
    }

    /// `gemv_panels` has the bits of one `gemv` per panel, for every width up to past two
    /// 12-vector passes, with and without accumulation.
    #[test]
    fn gemv_panels_matches_gemv_per_panel() {
        for isa in Isa::ALL.into_iter().filter(|isa| isa.is_supported()) {
            let kernels = isa.kernels().unwrap();
            let nr = kernels.nr;
            for k in [0, 1, 5, 40] {
                // Panels k·nr + 3 apart: the gap must not be read as columns.
                let panel_len = k * nr + 3;
                for n in (0..=26 * nr + 1).filter(|n| n % nr < 3 || n % nr > nr - 3) {
                    for accumulate in [false, true] {
                        let a = values(k, 30);
                        let panels = values(n.div_ceil(nr).max(1) * panel_len, 31);
                        let start = values(n, 32);
                        let mut got = start.clone();
                        // SAFETY: checked table; `a` holds k values, `panels` every panel.
                        unsafe {
                            let panels = super::micro::Panels::F32(&panels);
                            (kernels.gemv_panels)(k, &a, panels, panel_len, &mut got, accumulate)
                        };
                        check_16_bit_panels(
                            kernels,
                            (k, &a),
                            (&panels, panel_len),
                            &start,
                            accumulate,
                        );
                        let mut want = start;
                        for (q, c) in want.chunks_mut(nr).enumerate() {
                            let b = &panels[q * panel_len..];
                            // SAFETY: as above; the panel holds (k-1)·nr + c.len() values.
                            unsafe { (kernels.gemv)(k, &a, b, nr, c, accumulate) };
                        }
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&got), bits(&want), "{isa:?} k {k} n {n} {accumulate}");
                    }
                }
            }
        }
    }

    /// `gemv_panels` over the panels rounded to bfloat16 and to binary16 has the bits of
    /// `gemv_panels` over the rounded values widened to `f32` first.
    fn check_16_bit_panels(
        kernels: &super::Kernels,
        (k, a): (usize, &[f32]),
        (panels, panel_len): (&[f32], usize),
        start: &[f32],
        accumulate: bool,
    ) {
        use super::micro::Panels;
        use super::narrow::{bf16_from_f32, bf16_to_f32, f16_from_f32, f16_to_f32};
        let bf16: Vec<u16> = panels.iter().map(|&x| bf16_from_f32(x)).collect();
        let f16: Vec<u16> = panels.iter().map(|&x| f16_from_f32(x)).collect();
        let cases = [
            (
                "bf16",
                Panels::Bf16(&bf16),
                bf16.iter().map(|&b| bf16_to_f32(b)).collect::<Vec<_>>(),
            ),
            (
                "f16",
                Panels::F16(&f16),
                f16.iter().map(|&b| f16_to_f32(b)).collect(),
            ),
        ];
        for (format, stored, widened) in cases {
            let (mut got, mut want) = (start.to_vec(), start.to_vec());
            // SAFETY: checked table; `a` holds k values, both panel sets every panel.
            unsafe {
                (kernels.gemv_panels)(k, a, stored, panel_len, &mut got, accumulate);
                let widened = Panels::F32(&widened);
                (kernels.gemv_panels)(k, a, widened, panel_len, &mut want, accumulate);
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let n = start.len();
            assert_eq!(
                bits(&got),
                bits(&want),
                "{:?} {format} k {k} n {n}",
                kernels.isa
            );
        }
    }

    /// `softmax_row` has the bits `softmax_block` gives a single query, NaN and -inf included.
    #[test]
    fn softmax_row_matches_block_bit_for_bit() {
        for isa in Isa::ALL.into_iter().filter(|isa| isa.is_supported()) {
            let kernels = isa.kernels().unwrap();
            for keys in [0, 1, 5, 16, 17, 96] {
                for (case, old_max) in [f32::NEG_INFINITY, 0.3, 5.0, f32::NAN]
                    .into_iter()
                    .enumerate()
                {
                    let mut scores: Vec<f32> = values(keys, 9 + case as u32)
                        .iter()
                        .map(|v| v * 4.0)
                        .collect();
                    if case == 1 && keys > 2 {
                        scores[1] = f32::NEG_INFINITY;
                    }
                    if case == 2 && keys > 3 {
                        scores[2] = f32::NAN;
                    }
                    let (mut block, mut row) = (scores.clone(), scores);
                    let (mut max_b, mut sum_b, mut rescale) = ([old_max], [1.5f32], [0.0f32]);
                    let (mut max_r, mut sum_r) = (old_max, 1.5f32);
                    // SAFETY: checked table; one query, `keys` keys at stride 1.
                    let factor = unsafe {
                        (kernels.softmax_block)(
                            &mut block,
                            1,
                            keys,
                            &mut max_b,
                            &mut sum_b,
                            &mut rescale,
                        );
                        (kernels.softmax_row)(&mut row, &mut max_r, &mut sum_r)
                    };
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
                    let context = format!("{isa:?} keys {keys} case {case}");
                    assert_eq!(bits(&row), bits(&block), "{context}: probabilities");
                    assert_eq!(
                        bits(&[max_r, sum_r, factor]),
                        bits(&[max_b[0], sum_b[0], rescale[0]]),
                        "{context}"
                    );
                }
            }
        }
    }

    /// The contract flash attention relies on near the causal diagonal: a tile over the first
    /// `k1` steps, then `gemv` per row over the remaining steps (accumulating), gives the bits
    /// of one tile over all `k` steps.
    #[test]
    fn tile_then_gemv_continues_the_chain_bit_for_bit() {
        for isa in Isa::ALL.into_iter().filter(|isa| isa.is_supported()) {
            let kernels = isa.kernels().unwrap();
            let (mr, nr) = (kernels.mr, kernels.nr);
            for (k1, k) in [(0, 1), (1, 5), (3, 11), (64, 64), (40, 96)] {
                let ldc = nr + 3;
                let a = values(k * mr, 1);
                let b = values(k * nr, 2);
                let mut whole = values((mr - 1) * ldc + nr, 3);
                let mut split = whole.clone();
                // SAFETY: the table came from `Isa::kernels`; the slices have the documented
                // lengths (a k1-step tile reads a prefix of the same operands).
                unsafe {
                    (kernels.tile)(k, &a, mr, &b, nr, &mut whole, ldc, true);
                    (kernels.tile)(k1, &a, mr, &b, nr, &mut split, ldc, true);
                }
                for i in 0..mr {
                    let a_rest: Vec<f32> = (k1..k).map(|p| a[p * mr + i]).collect();
                    let row = &mut split[i * ldc..][..nr];
                    // SAFETY: as above; `b` from step k1 holds (k-k1-1)·nr + nr values.
                    unsafe { (kernels.gemv)(k - k1, &a_rest, &b[k1 * nr..], nr, row, true) };
                }
                for i in 0..mr {
                    let bits = |c: &[f32]| -> Vec<u32> {
                        c[i * ldc..][..nr].iter().map(|x| x.to_bits()).collect()
                    };
                    assert_eq!(bits(&split), bits(&whole), "{isa:?} k1 {k1} k {k} row {i}");
                }
            }
        }
    }
}

/// Checks the operand lengths of a `k`-step microtile (see [`Kernels::tile`]): afterwards step
/// `p < k` may read `a[p*lda .. p*lda + mr]` and `b[p*ldb .. p*ldb + nr]`, and the tile
/// `c[.. (mr-1)*ldc + nr]` exists. The SIMD tiles rely on it for their pointer loads.
///
/// # Panics
/// When an operand is shorter than the contract requires (a bug in the caller).
#[inline(always)]
pub(crate) fn check_tile_operands(
    k: usize,
    (a, lda): (&[f32], usize),
    (b, ldb): (&[f32], usize),
    (c, ldc): (&[f32], usize),
    mr: usize,
    nr: usize,
) {
    let ok = (k == 0
        || (lda >= mr
            && ldb >= nr
            && fits(a.len(), k - 1, lda, mr)
            && fits(b.len(), k - 1, ldb, nr)))
        && ldc >= nr
        && fits(c.len(), mr - 1, ldc, nr);
    assert!(ok, "microtile operands shorter than the contract");
}

/// Whether `len` values hold `steps` rows of stride `stride` followed by `width` more: the
/// extent `steps · stride + width`, with overflow counting as too long.
pub(crate) fn fits(len: usize, steps: usize, stride: usize, width: usize) -> bool {
    steps
        .checked_mul(stride)
        .and_then(|n| n.checked_add(width))
        .is_some_and(|n| n <= len)
}

/// Checks the operand lengths of a `gemv` (see [`Kernels::gemv`]): `a` holds `k` values and,
/// when `k > 0`, `b` holds `(k-1)·ldb + n`. The SIMD versions rely on it for their loads.
///
/// # Panics
/// When an operand is shorter than the contract requires (a bug in the caller).
#[inline(always)]
pub(crate) fn check_gemv_operands(k: usize, a: &[f32], b: &[f32], ldb: usize, n: usize) {
    let ok = a.len() >= k && (k == 0 || n == 0 || fits(b.len(), k - 1, ldb, n));
    assert!(ok, "gemv operands shorter than the contract");
}

/// Checks the operand lengths of a `gemv_panels` (see [`Kernels::gemv_panels`]) over `n`
/// columns of `nr`-wide panels: `a` holds `k` values and, when `k > 0`, `panel_len ≥ k·nr`
/// and the `panels` stored values hold the last column's panel up to its step `k-1`. The SIMD versions rely
/// on it for their loads.
///
/// # Panics
/// When an operand is shorter than the contract requires (a bug in the caller).
#[inline(always)]
pub(crate) fn check_gemv_panel_operands(
    k: usize,
    a: &[f32],
    panels: usize,
    panel_len: usize,
    nr: usize,
    n: usize,
) {
    let ok = a.len() >= k
        && (k == 0
            || n == 0
            || (k.checked_mul(nr).is_some_and(|len| len <= panel_len)
                && fits(
                    panels,
                    (n - 1) / nr,
                    panel_len,
                    (k - 1) * nr + (n - 1) % nr + 1,
                )));
    assert!(ok, "gemv_panels operands shorter than the contract");
}

/// `c[i*ldc + j] (+)= Σ_p a[p*lda + i] · b[p*ldb + j]` for an `mr × nr` tile: see [`Kernels::tile`].
pub(crate) type TileFn = unsafe fn(
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
);
/// The online-softmax update of one key block: see [`Kernels::softmax_block`].
pub(crate) type SoftmaxBlockFn = unsafe fn(
    scores: &mut [f32],
    lds: usize,
    keys: usize,
    max: &mut [f32],
    sum: &mut [f32],
    rescale: &mut [f32],
);
/// One row of a microtile, any width: see [`Kernels::gemv`].
pub(crate) type GemvFn =
    unsafe fn(k: usize, a: &[f32], b: &[f32], ldb: usize, c: &mut [f32], accumulate: bool);
/// `gemv` over consecutive packed panels: see [`Kernels::gemv_panels`].
pub(crate) type GemvPanelsFn = unsafe fn(
    k: usize,
    a: &[f32],
    panels: micro::Panels<'_>,
    panel_len: usize,
    c: &mut [f32],
    accumulate: bool,
);
/// The online-softmax update of one query: see [`Kernels::softmax_row`].
pub(crate) type SoftmaxRowFn = unsafe fn(row: &mut [f32], max: &mut f32, sum: &mut f32) -> f32;
/// See [`Kernels::softcap`].
pub(crate) type SoftcapFn = unsafe fn(values: &mut [f32], cap: f32);
/// A hint to bring `data` into L2: see [`Kernels::prefetch`].
pub(crate) type PrefetchFn = unsafe fn(data: &[f32]);
/// Stored keys or values widened to `f32`: see [`Kernels::widen`].
pub(crate) type WidenFn =
    unsafe fn(src: widen::Narrow<'_>, rows: usize, cols: usize, dst: &mut [f32], dst_stride: usize);
/// `gemv` over stored keys or values, for up to `widen::STORED_ROWS` rows at once: see
/// [`Kernels::gemv_stored`].
pub(crate) type GemvStoredFn = unsafe fn(
    k: usize,
    a: &[f32],
    lda: usize,
    b: widen::Narrow<'_>,
    c: &mut [f32],
    ldc: usize,
    n: usize,
    rows: usize,
    accumulate: bool,
);
/// A scaled out-of-place transpose: see [`Kernels::transpose`].
pub(crate) type TransposeFn = unsafe fn(
    src: &[f32],
    src_stride: usize,
    rows: usize,
    cols: usize,
    dst: &mut [f32],
    dst_stride: usize,
    scale: f32,
);

/// The microkernels of one instruction set. Every function pointer is `unsafe` only because it
/// may be compiled with `#[target_feature]`; a `Kernels` value is handed out only by
/// [`Isa::kernels`], after checking that the CPU supports its instruction set, which makes every
/// call through it sound.
#[derive(Debug)]
pub(crate) struct Kernels {
    /// Which instruction set this table is for.
    pub isa: Isa,
    /// Rows of a microtile.
    pub mr: usize,
    /// Columns of a microtile.
    pub nr: usize,
    /// The GEMM microtile, `C (mr × nr) (+)= A (mr × k) · B (k × nr)`, on "k-major" operands:
    /// element `(i, p)` of `A` is `a[p*lda + i]` and element `(p, j)` of `B` is `b[p*ldb + j]`
    /// (a packed panel is the case `lda = mr`, `ldb = nr`), with `lda ≥ mr`, `ldb ≥ nr`, `a`
    /// holding at least `(k-1)*lda + mr` values and `b` at least `(k-1)*ldb + nr` when `k > 0`.
    /// `c` is the tile with row stride `ldc ≥ nr`, at least `(mr-1)*ldc + nr` values. For every
    /// `(i, j)` it starts from `c[i*ldc + j]` when `accumulate` is true (else from 0), adds
    /// `a(i, p) * b(p, j)` for `p = 0, 1, .., k-1` in that order (fused multiply-add on FMA
    /// instruction sets) and stores the result. The order is part of the contract: `gemv`
    /// repeats it for one row, so both paths give the same bits, and a chain split between a
    /// tile and a `gemv` (or two calls) is the same chain. Every value stored that is a NaN is
    /// the canonical quiet NaN `f32::NAN` (`0x7fc00000`): when two NaNs meet in an add or
    /// multiply-add, which one an instruction passes on depends on the operand order the
    /// compiler picked, so NaN payloads would otherwise differ between the kernels.
    pub tile: TileFn,
    /// The online-softmax update for one block of `keys` keys against `q = max.len()` queries,
    /// scores stored key-major: `scores[j*lds + i]` is query `i`'s score for key `j`
    /// (`lds ≥ q`; `sum` and `rescale` also hold `q` values). For each query `i`:
    /// `new = max(max[i], max_j scores[j][i])`; `rescale[i] = exp(max[i] - new)`, or exactly 1
    /// when `max[i] == new` (also when both are `-inf`); `sum[i] *= rescale[i]`; `max[i] = new`;
    /// then for `j = 0, 1, ..` in order `scores[j][i] = exp(scores[j][i] - new)` (0 when `new` is
    /// `-inf`) and `sum[i] += scores[j][i]`. A NaN score makes that query's outputs NaN.
    pub softmax_block: SoftmaxBlockFn,
    /// One row of `tile`, of any width: for `j < c.len()`, starts from `c[j]` when
    /// `accumulate` (else 0) and adds `a[p] * b[p*ldb + j]` for `p = 0, 1, .., k-1` in that
    /// order, the same arithmetic as the tile's (NaNs stored canonical), so a row computed
    /// either way has the same bits. `a` holds at least `k` values, `b` at least `(k-1)*ldb + c.len()` when `k > 0`.
    /// For a few rows (decoding) it avoids computing a mostly empty tile; near the causal
    /// diagonal it continues one row's chain over the keys only that row sees.
    pub gemv: GemvFn,
    /// `gemv` across consecutive `nr`-column panels of a packed `B` (the layout of
    /// [`PackedB`]): column `j` of `c` is column `j % nr` of panel `j / nr`, whose step `p`
    /// is at `panels[(j / nr) * panel_len + p * nr ..]` (`panel_len ≥ k·nr`). Each column is
    /// the chain `gemv` computes, so the bits are those of one `gemv` per panel; a
    /// one-row product (decoding) gets enough independent chains from several panels at
    /// once. `a` holds at least `k` values and `panels` every element read. Panels of 16-bit
    /// elements are widened in registers, exactly, so they give the bits of the same panels
    /// widened to `f32` first.
    pub gemv_panels: GemvPanelsFn,
    /// `softmax_block` for one query whose scores against a key block are the contiguous
    /// `row`: the same operations and order, so the same bits (`max` and `sum` are the query's
    /// running values; returns its rescale factor).
    pub softmax_row: SoftmaxRowFn,
    /// `dst[p * dst_stride + t] = scale * src[t * src_stride + p]` for `t < rows`, `p < cols`
    /// (a scale of 1 copies exactly): `transpose::transpose_scaled`, or on x86-64 its AVX
    /// version, whose blocks are vector shuffles (both walk the matrix the same way).
    pub transpose: TransposeFn,
    /// Logit soft-capping in place, `v = cap · tanh(v / cap)` for every value (`cap > 0`,
    /// finite): `tanh::softcap` or its vector version. Each value takes the same arithmetic
    /// wherever it sits in the slice, so a score capped in a key-major column (the tile path)
    /// and in a query's row (the row path) gets the same bits.
    pub softcap: SoftcapFn,
    /// Asks for every cache line of `data` to be brought into L2 (`prefetcht1` on x86-64;
    /// nothing in the portable table): the attention requests its next key block this way.
    pub prefetch: PrefetchFn,
    /// `dst[r * dst_stride + c]` = element `(r, c)` of the stored `rows × cols` matrix `src`
    /// widened to `f32`, exactly as `narrow`'s scalar conversions widen it (a `q8_0` value
    /// is its integer times its block's scale, one `f32` product), for `r < rows`,
    /// `c < cols`; other values of `dst` are untouched. The attention widens a key block's
    /// panel and value rows this way.
    pub widen: WidenFn,
    /// `gemv` with `B` the stored `k × n` matrix `b`, each element widened in registers
    /// exactly as `widen` widens it, for `rows ≤ widen::STORED_ROWS` rows at once (row `r`:
    /// `a[r·lda ..][..k]` into `c[r·ldc ..][..n]`), each element widened once for all of
    /// them: row by row the bits of `gemv` over the widened matrix (so also of the tile's
    /// chains). The attention's row path (decoding) reads 16- and 8-bit keys and values
    /// this way, the query heads that share a key/value head together, without widening a
    /// block first.
    pub gemv_stored: GemvStoredFn,
    /// The table's vector `exp` of every value in place (the unit tests' access to it).
    #[cfg(all(test, feature = "std"))]
    pub exp: unsafe fn(&mut [f32]),
    /// The table's softmax-probability `exp` of every value in place (for the unit tests).
    #[cfg(all(test, feature = "std"))]
    pub probability: unsafe fn(&mut [f32]),
}

impl Kernels {
    /// Whether `rows` rows are few enough to go row by row (`gemv`, `softmax_row`) rather than
    /// through mostly empty `mr`-row tiles: at most half a tile. The GEMM, the attention and
    /// the thread choice all use this one rule.
    pub(crate) fn few_rows(&self, rows: usize) -> bool {
        2 * rows <= self.mr
    }
}
