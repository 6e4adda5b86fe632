//! The kernel layer: slices with run-time dimensions, one set of microkernels per instruction
//! set, and the one place where the instruction set is chosen.
//!
//! The typed front ([`Tensor`](crate::Tensor), [`Heads`](crate::Heads), [`Mha`](crate::Mha))
//! checks shapes and calls into this layer:
//!
//! - [`gemm()`]: `C = A · B` in the BLIS shape (packed panels, cache blocking, a register-blocked
//!   microkernel), with `B` packed once ([`PackedB`]).
//! - `flash`: causal attention in the FlashAttention-2 shape (online softmax over key blocks).
//! - [`exp`]: the crate's own accurate `exp`, scalar and vectorised.
//!
//! Each instruction set provides the same small `Kernels` table: a GEMM microtile, an online
//! softmax row step and an `axpy`. [`Isa::detect`] picks the widest one this CPU runs, once.

pub mod exp;
pub(crate) mod flash;
pub mod gemm;
pub(crate) mod parallel;
mod portable;
mod softmax;

pub use gemm::{gemm, PackedB};

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
}

impl Isa {
    /// Every instruction set, narrowest first.
    pub const ALL: [Isa; 3] = [Isa::Portable, Isa::Avx2, Isa::Avx512];

    /// The name used by the `MHA_ISA` environment variable: `portable`, `avx2` or `avx512`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Whether this CPU can run the instruction set.
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Portable => true,
            Isa::Avx2 | Isa::Avx512 => false,
        }
    }

    /// The instruction set the crate uses by default, resolved on first use and cached.
    ///
    /// The widest supported one, unless (with feature `std`) the environment variable
    /// `MHA_ISA` names a supported narrower one (`portable`, `avx2` or `avx512`); an unknown or
    /// unsupported name is ignored.
    pub fn detect() -> Isa {
        static CHOSEN: AtomicU8 = AtomicU8::new(u8::MAX);
        let cached = CHOSEN.load(Ordering::Relaxed);
        if let Some(&isa) = Isa::ALL.get(usize::from(cached)) {
            return isa;
        }
        let isa = Isa::requested().unwrap_or_else(|| {
            Isa::ALL
                .into_iter()
                .rev()
                .find(|isa| isa.is_supported())
                .unwrap_or(Isa::Portable)
        });
        let index = Isa::ALL.iter().position(|&i| i == isa).unwrap_or(0);
        CHOSEN.store(index as u8, Ordering::Relaxed);
        isa
    }

    /// The supported instruction set named by `MHA_ISA`, if any.
    fn requested() -> Option<Isa> {
        #[cfg(feature = "std")]
        {
            let name = std::env::var("MHA_ISA").ok()?;
            Isa::ALL
                .into_iter()
                .find(|isa| isa.name().eq_ignore_ascii_case(name.trim()) && isa.is_supported())
        }
        #[cfg(not(feature = "std"))]
        {
            None
        }
    }

    /// The kernel table of this instruction set.
    ///
    /// # Errors
    /// [`ShapeError::UnsupportedIsa`] when this CPU cannot run it.
    pub(crate) fn kernels(self) -> Result<&'static Kernels, ShapeError> {
        if !self.is_supported() {
            return Err(ShapeError::UnsupportedIsa { isa: self.name() });
        }
        Ok(match self {
            Isa::Portable | Isa::Avx2 | Isa::Avx512 => &portable::KERNELS,
        })
    }
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
/// `o[j] += p · v[j]`: see [`Kernels::axpy`].
pub(crate) type AxpyFn = unsafe fn(p: f32, v: &[f32], o: &mut [f32]);

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
    /// instruction sets) and stores the result. The order is part of the contract: `axpy`
    /// repeats one step of it exactly, so both paths give the same bits.
    pub tile: TileFn,
    /// The online-softmax update for one block of `keys` keys against `q = max.len()` queries,
    /// scores stored key-major: `scores[j*lds + i]` is query `i`'s score for key `j`
    /// (`lds ≥ q`; `sum` and `rescale` also hold `q` values). For each query `i`:
    /// `new = max(max[i], max_j scores[j][i])`; `rescale[i] = exp(max[i] - new)`, or exactly 1
    /// when `max[i] == new` (also when both are `-inf`); `sum[i] *= rescale[i]`; `max[i] = new`;
    /// then for `j = 0, 1, ..` in order `scores[j][i] = exp(scores[j][i] - new)` (0 when `new` is
    /// `-inf`) and `sum[i] += scores[j][i]`. A NaN score makes that query's outputs NaN.
    pub softmax_block: SoftmaxBlockFn,
    /// `o[j] = o[j] + p * v[j]` for `j < o.len()` (fused on FMA instruction sets, the same
    /// arithmetic as one step of `tile`). `v` holds at least `o.len()` values.
    pub axpy: AxpyFn,
}
