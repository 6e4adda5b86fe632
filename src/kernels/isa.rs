//! The instruction sets the kernels are compiled for, and the one place where the CPU is asked
//! which it runs.

use core::sync::atomic::{AtomicU8, Ordering};

use crate::error::ShapeError;
use crate::kernels::table::Kernels;

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
            Isa::Portable => Ok(&crate::kernels::simd::portable::KERNELS),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 if self.is_supported() && has_avx_vnni() => {
                Ok(&crate::kernels::simd::avx2::vnni::KERNELS)
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 if self.is_supported() => Ok(&crate::kernels::simd::avx2::KERNELS),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512
                if self.is_supported()
                    && has_avx512_vnni()
                    && crate::kernels::simd::amx::usable() =>
            {
                Ok(&crate::kernels::simd::avx512::with_amx::KERNELS)
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 if self.is_supported() && has_avx512_vnni() => {
                Ok(&crate::kernels::simd::avx512::vnni::KERNELS)
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 if self.is_supported() => Ok(&crate::kernels::simd::avx512::KERNELS),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => Ok(&crate::kernels::simd::neon::KERNELS),
            _ => Err(ShapeError::UnsupportedIsa { isa: self.name() }),
        }
    }
}

/// Whether the CPU has AVX512-VNNI (the AVX-512 table's int8 tile then sums with `vpdpbusd`;
/// the OS state is AVX-512's).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx512_vnni() -> bool {
    #[cfg(feature = "std")]
    {
        std::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(feature = "std"))]
    {
        cpuid::has_avx512_vnni()
    }
}

/// Whether the CPU has AVX-VNNI (the AVX2 table's int8 tile then sums with `vpdpbusd`; the
/// OS state is AVX's).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx_vnni() -> bool {
    #[cfg(feature = "std")]
    {
        std::is_x86_feature_detected!("avxvnni")
    }
    #[cfg(not(feature = "std"))]
    {
        cpuid::has_avx_vnni()
    }
}

/// CPU-feature detection without `std`, straight from `cpuid` and `xgetbv` (also compiled for the
/// tests, which compare it with `std::is_x86_feature_detected!`).
#[cfg(all(target_arch = "x86_64", any(not(feature = "std"), test)))]
pub(crate) mod cpuid {
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
    /// `cpuid` leaf 7.0, ECX: AVX512-VNNI.
    const AVX512_VNNI: u32 = 1 << 11;
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

    /// `cpuid` leaf 7.1, EAX: AVX-VNNI.
    const AVX_VNNI: u32 = 1 << 4;

    /// Whether the CPU has AVX-VNNI (the caller checked AVX2 itself).
    pub(crate) fn has_avx_vnni() -> bool {
        cpuid(0, 0).eax >= 7 && cpuid(7, 0).eax >= 1 && cpuid(7, 1).eax & AVX_VNNI != 0
    }

    /// Whether the CPU has AVX512-VNNI (the caller checked AVX-512 itself).
    pub(crate) fn has_avx512_vnni() -> bool {
        cpuid(0, 0).eax >= 7 && cpuid(7, 0).ecx & AVX512_VNNI != 0
    }

    /// Whether the CPU has the features of `isa` and the OS saves its registers.
    pub(crate) fn supports(isa: Isa) -> bool {
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
