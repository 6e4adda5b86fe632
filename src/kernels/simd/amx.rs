//! Intel AMX (Advanced Matrix Extensions): eight tile registers of up to 16 rows of 64 bytes,
//! and `tdpbf16ps`, which adds to a `16 × 16` tile of `f32` the products of a `16 × 32` tile of
//! bfloat16 and a `32 × 16` one (the latter stored as 16 rows of 16 column pairs). Rust has no
//! stable AMX intrinsics, so the kernel is inline assembly; the CPU and the operating system
//! are asked once, here, whether it may run ([`usable`]).
//!
//! A tile of [`bf16_tile`] is `32 × 32` of `C`: four accumulator tiles (`tmm0..3`), two of `A`
//! (`tmm4, tmm5`: rows 0..16 and 16..32) and two of `B` (`tmm6, tmm7`: columns 0..16 and 16..32)
//! per step of 32 values of the reduction; one call runs the tiles of all its rows over one or
//! more panels of `B` (configuring the registers once, and once more for a short last row of
//! tiles).

use core::arch::asm;
use core::arch::x86_64::{__cpuid_count, _xgetbv};
use core::sync::atomic::{AtomicU8, Ordering};

use crate::kernels::gemm::bf16::{padded_rows, B_STEP, STEP, TILE};

/// A tile configuration (palette 1): 64 bytes, byte 0 the palette, bytes `16 + 2t` the bytes
/// per row of register `t` (little endian), byte `48 + t` its rows.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    /// Every register 64 bytes wide; the accumulators (`tmm0..3`) and `A` (`tmm4, 5`) `rows`
    /// rows (at most 16), `B` (`tmm6, 7`) 16.
    const fn new(rows: u8) -> TileConfig {
        let mut bytes = [0u8; 64];
        bytes[0] = 1;
        let mut t = 0;
        while t < 8 {
            bytes[16 + 2 * t] = 64;
            bytes[48 + t] = if t < 6 { rows } else { 16 };
            t += 1;
        }
        TileConfig(bytes)
    }
}

/// Full tiles: 16 rows in every register.
const FULL: TileConfig = TileConfig::new(16);

/// Whether this process may run AMX-BF16: the CPU has AMX-TILE and AMX-BF16, the OS saves
/// the tile state (XCR0 bits 17 and 18) and (Linux, the only OS asked) granted this process
/// the tile data state on request (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`,
/// made once; the grant holds for every thread of the process). Any other OS: false.
pub(crate) fn usable() -> bool {
    /// 0: not asked yet; 1: no; 2: yes.
    static STATE: AtomicU8 = AtomicU8::new(0);
    match STATE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let usable = cpu_has_amx_bf16() && request_tile_data();
            STATE.store(if usable { 2 } else { 1 }, Ordering::Relaxed);
            usable
        }
    }
}

/// The CPU has AMX-TILE and AMX-BF16 and XCR0 enables their state.
fn cpu_has_amx_bf16() -> bool {
    /// `cpuid` leaf 7.0, EDX: AMX-BF16 and AMX-TILE.
    const AMX_BF16_TILE: u32 = (1 << 22) | (1 << 24);
    /// `cpuid` leaf 1, ECX: OSXSAVE (`xgetbv` enabled).
    const OSXSAVE: u32 = 1 << 27;
    /// XCR0: tile configuration and tile data.
    const XCR0_TILE: u64 = (1 << 17) | (1 << 18);
    // SAFETY: every x86-64 CPU has `cpuid` (the intrinsic is safe in newer Rust versions).
    #[allow(unused_unsafe)]
    let (max_leaf, leaf1, leaf7) = unsafe {
        (
            __cpuid_count(0, 0).eax,
            __cpuid_count(1, 0).ecx,
            __cpuid_count(7, 0).edx,
        )
    };
    if max_leaf < 7 || leaf1 & OSXSAVE == 0 || leaf7 & AMX_BF16_TILE != AMX_BF16_TILE {
        return false;
    }
    // SAFETY: OSXSAVE is set, so the OS enabled `xgetbv`; XCR0 always exists.
    let xcr0 = unsafe { _xgetbv(0) };
    xcr0 & XCR0_TILE == XCR0_TILE
}

/// Asks Linux for the tile data state: true when granted.
#[cfg(target_os = "linux")]
fn request_tile_data() -> bool {
    /// The `arch_prctl` system call on x86-64 Linux.
    const SYS_ARCH_PRCTL: i64 = 158;
    /// `arch_prctl` code: request permission for an extended state component.
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    /// The tile data state component.
    const XFEATURE_XTILEDATA: i64 = 18;
    let result: i64;
    // SAFETY: `arch_prctl(ARCH_REQ_XCOMP_PERM, 18)` reads no memory of ours and changes only
    // which state components this process may use; the kernel clobbers rcx and r11.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => result,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    result == 0
}

/// Other operating systems are not asked (and may not have granted the state).
#[cfg(not(target_os = "linux"))]
fn request_tile_data() -> bool {
    false
}

/// `C (rows × 32·panels) (+)= A · B` with `tdpbf16ps`, `steps` steps of 32 values of the
/// reduction: per `32 × 32` tile of `C` (rows of tiles in order, in each the panels of `B`
/// in order), the last row of tiles short (16 rows of `A` and `C` in registers shortened to
/// the rows left) when at most 16 rows are left, so that a few rows read `B` without
/// computing 32.
///
/// `a`: row `i` at `a[i · lda ..]`, `steps · 32` bfloat16 values. `b`: panel `p` (columns
/// `32p ..` of `C`) at `b[p · stride ..]`, per step [`B_STEP`] values, columns 0..16 then
/// 16..32, each 16 rows (the step's value pairs) of 16 columns of one pair: value `2r + e` of
/// the step for column `j` at `r · 32 + 2j + e`. `c`: row stride `ldc`, from `c` when
/// `accumulate` else from zero. Steps run in order; inside a step the sum
/// is the instruction's own (products exact, bfloat16 subnormals read as zero, `f32`
/// subnormal results flushed to zero), row by row: a row's result does not depend on the
/// others.
///
/// # Safety
/// [`usable`] returned true; with `padded` = [`padded_rows`]`(rows)`: `lda ≥ steps · 32` and `a.len() ≥
/// (padded - 1) · lda + steps · 32` (or `steps` is 0), `panels ≥ 1`, `b.len() ≥ (panels - 1) ·
/// stride + steps · B_STEP`, `ldc ≥ 32 · panels` and `c.len() ≥ (padded - 1) · ldc + 32 ·
/// panels`.
pub(crate) unsafe fn bf16_tile(
    (a, lda): (&[u16], usize),
    rows: usize,
    (b, panels, stride): (&[u16], usize, usize),
    steps: usize,
    (c, ldc): (&mut [f32], usize),
    accumulate: bool,
) {
    debug_assert!(panels >= 1 && b.len() >= (panels - 1) * stride + steps * B_STEP);
    debug_assert!(ldc >= TILE * panels);
    let padded = padded_rows(rows);
    let (full, short) = (padded / TILE, padded % TILE);
    debug_assert!(padded == 0 || c.len() >= (padded - 1) * ldc + TILE * panels);
    debug_assert!(padded == 0 || steps == 0 || lda >= steps * STEP);
    debug_assert!(padded == 0 || steps == 0 || a.len() >= (padded - 1) * lda + steps * STEP);
    let operands = Operands {
        a: a.as_ptr(),
        lda,
        b: b.as_ptr(),
        steps,
        c: c.as_mut_ptr(),
        ldc,
        accumulate,
    };
    // SAFETY: AMX is usable (the caller's contract); `full` tiles of 32 rows and one of
    // `short` rows lie inside `a` and `c` by the length conditions; `ldtilecfg` and
    // `tilerelease` bracket every use of the tile registers, which no other code uses.
    unsafe {
        if full > 0 {
            asm!("ldtilecfg [{}]", in(reg) FULL.0.as_ptr(), options(nostack, readonly));
            for tile in 0..full {
                for p in 0..panels {
                    operands.at(tile * TILE).panel(p, stride).tile::<true>();
                }
            }
        }
        if short > 0 {
            let config = TileConfig::new(short as u8);
            asm!("ldtilecfg [{}]", in(reg) config.0.as_ptr(), options(nostack, readonly));
            for p in 0..panels {
                operands.at(full * TILE).panel(p, stride).tile::<false>();
            }
        }
        asm!("tilerelease", options(nostack, nomem));
    }
}

/// The operands of one tile of [`bf16_tile`], its top row at `a` and `c`.
#[derive(Clone, Copy)]
struct Operands {
    a: *const u16,
    lda: usize,
    b: *const u16,
    steps: usize,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
}

impl Operands {
    /// The tile whose top row is row `i`.
    ///
    /// # Safety
    /// Row `i` lies inside `a` and `c`.
    unsafe fn at(self, i: usize) -> Operands {
        // SAFETY: the caller's.
        unsafe {
            Operands {
                a: self.a.add(i * self.lda),
                c: self.c.add(i * self.ldc),
                ..self
            }
        }
    }

    /// The tile of panel `p` of `B` (at `p · stride`): `C` from column `32p`.
    ///
    /// # Safety
    /// Panel `p` lies inside `b`, its columns inside `c`.
    unsafe fn panel(self, p: usize, stride: usize) -> Operands {
        // SAFETY: the caller's.
        unsafe {
            Operands {
                b: self.b.add(p * stride),
                c: self.c.add(p * TILE),
                ..self
            }
        }
    }

    /// One tile: with `LOWER` (its lower 16 rows too) 32 rows in the full configuration,
    /// else the configured rows (at most 16) of `tmm0`, `tmm1` and `tmm4` only.
    ///
    /// # Safety
    /// As [`bf16_tile`], with the matching configuration loaded.
    #[inline(always)]
    unsafe fn tile<const LOWER: bool>(self) {
        let Operands {
            a,
            lda,
            b,
            steps,
            c,
            ldc,
            accumulate,
        } = self;
        let (a_stride, c_stride) = (lda * 2, ldc * 4);
        // SAFETY: the caller's contract; each `tileloadd` / `tilestored` touches the
        // configured rows of 64 bytes from its base at its stride.
        unsafe {
            let (c1, c2, c3) = (c.add(16), c.add(16 * ldc), c.add(16 * ldc + 16));
            if accumulate {
                asm!("tileloadd tmm0, [{c0} + {s}*1]", "tileloadd tmm1, [{c1} + {s}*1]",
                     c0 = in(reg) c, c1 = in(reg) c1, s = in(reg) c_stride,
                     options(nostack, readonly));
                if LOWER {
                    asm!("tileloadd tmm2, [{c2} + {s}*1]", "tileloadd tmm3, [{c3} + {s}*1]",
                         c2 = in(reg) c2, c3 = in(reg) c3, s = in(reg) c_stride,
                         options(nostack, readonly));
                }
            } else {
                asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    options(nostack, nomem)
                );
            }
            for step in 0..steps {
                let (a0, b0) = (a.add(step * STEP), b.add(step * B_STEP));
                asm!(
                    "tileloadd tmm4, [{a0} + {sa}*1]",
                    "tileloadd tmm6, [{b0} + {sb}*1]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tileloadd tmm7, [{b1} + {sb}*1]",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    a0 = in(reg) a0, sa = in(reg) a_stride, b0 = in(reg) b0,
                    b1 = in(reg) b0.add(B_STEP / 2), sb = in(reg) 64usize,
                    options(nostack, readonly),
                );
                if LOWER {
                    asm!(
                        "tileloadd tmm5, [{a1} + {sa}*1]",
                        "tdpbf16ps tmm2, tmm5, tmm6",
                        "tdpbf16ps tmm3, tmm5, tmm7",
                        a1 = in(reg) a0.add(16 * lda), sa = in(reg) a_stride,
                        options(nostack, readonly),
                    );
                }
            }
            asm!("tilestored [{c0} + {s}*1], tmm0", "tilestored [{c1} + {s}*1], tmm1",
                 c0 = in(reg) c, c1 = in(reg) c1, s = in(reg) c_stride, options(nostack));
            if LOWER {
                asm!("tilestored [{c2} + {s}*1], tmm2", "tilestored [{c3} + {s}*1], tmm3",
                     c2 = in(reg) c2, c3 = in(reg) c3, s = in(reg) c_stride, options(nostack));
            }
        }
    }
}
