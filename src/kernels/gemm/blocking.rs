//! The GEMM's cache blocking, from the data cache sizes this CPU reports.
//!
//! x86-64 reports its caches through `cpuid`: leaf 4 on Intel, leaf `0x8000001D` on AMD and
//! Hygon (the same format: ways, partitions, line size and sets per cache level). Elsewhere, or
//! when the CPU reports nothing usable, [`CacheSizes::FALLBACK`]. The sizes are read once.
//! The blocks do not change any result: every element of `C` is the same chain of
//! multiply-adds however the loops are cut.

use core::sync::atomic::{AtomicUsize, Ordering};

use crate::kernels::Kernels;

/// The data cache sizes the GEMM blocks for, in bytes, per core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CacheSizes {
    /// The level-1 data cache.
    pub l1d: usize,
    /// The level-2 cache.
    pub l2: usize,
}

impl CacheSizes {
    /// What the blocking assumes when the CPU reports nothing: small for a current core
    /// (32 KiB of L1d, 256 KiB of L2), so that the blocks fit wherever the code runs.
    pub(crate) const FALLBACK: CacheSizes = CacheSizes {
        l1d: 32 << 10,
        l2: 256 << 10,
    };

    /// This CPU's, detected on first use and cached.
    pub(crate) fn detect() -> CacheSizes {
        static L1D: AtomicUsize = AtomicUsize::new(0);
        static L2: AtomicUsize = AtomicUsize::new(0);
        let (l1d, l2) = (L1D.load(Ordering::Relaxed), L2.load(Ordering::Relaxed));
        if l1d != 0 && l2 != 0 {
            return CacheSizes { l1d, l2 };
        }
        let sizes = reported().unwrap_or(CacheSizes::FALLBACK);
        L1D.store(sizes.l1d, Ordering::Relaxed);
        L2.store(sizes.l2, Ordering::Relaxed);
        sizes
    }
}

/// The sizes this CPU reports, if it reports both levels.
#[cfg(target_arch = "x86_64")]
fn reported() -> Option<CacheSizes> {
    x86::reported()
}

/// The sizes this CPU reports: none off x86-64 (the AArch64 cache size registers are not
/// readable from user space).
#[cfg(not(target_arch = "x86_64"))]
fn reported() -> Option<CacheSizes> {
    None
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::x86_64::{__cpuid_count, CpuidResult};

    use super::CacheSizes;

    /// `cpuid` with a sub-leaf.
    fn cpuid(leaf: u32, sub_leaf: u32) -> CpuidResult {
        // SAFETY: every x86-64 CPU has `cpuid`. (The intrinsic is safe in newer Rust versions,
        // hence the allow.)
        #[allow(unused_unsafe)]
        unsafe {
            __cpuid_count(leaf, sub_leaf)
        }
    }

    /// The cache leaf for this vendor (4 on Intel, `0x8000001D` on AMD and Hygon), if the
    /// CPU has it.
    fn cache_leaf() -> Option<u32> {
        let vendor = cpuid(0, 0);
        let name = [vendor.ebx, vendor.edx, vendor.ecx];
        let is = |text: &[u8; 12]| {
            name.iter()
                .flat_map(|word| word.to_le_bytes())
                .eq(text.iter().copied())
        };
        if is(b"GenuineIntel") && vendor.eax >= 4 {
            Some(4)
        } else if (is(b"AuthenticAMD") || is(b"HygonGenuine"))
            && cpuid(0x8000_0000, 0).eax >= 0x8000_001D
        {
            Some(0x8000_001D)
        } else {
            None
        }
    }

    /// The level-1 data and level-2 sizes the cache leaf lists (its sub-leaves end with a
    /// cache of type 0).
    pub(super) fn reported() -> Option<CacheSizes> {
        let leaf = cache_leaf()?;
        let (mut l1d, mut l2) = (0, 0);
        for sub_leaf in 0..16 {
            let r = cpuid(leaf, sub_leaf);
            let kind = r.eax & 0x1f;
            if kind == 0 {
                break;
            }
            let level = (r.eax >> 5) & 0x7;
            let ways = (r.ebx >> 22) as usize + 1;
            let partitions = ((r.ebx >> 12) & 0x3ff) as usize + 1;
            let line = (r.ebx & 0xfff) as usize + 1;
            let sets = r.ecx as usize + 1;
            let size = ways * partitions * line * sets;
            // Type 1 is a data cache, 3 a unified one.
            match (level, kind) {
                (1, 1) => l1d = size,
                (2, 1 | 3) => l2 = size,
                _ => {}
            }
        }
        (l1d > 0 && l2 > 0).then_some(CacheSizes { l1d, l2 })
    }
}

/// The fewest `mr`-row panels of `A` a micro-panel of `B` should serve while it is in L1.
const MIN_PANELS: usize = 8;

/// How the GEMM cuts its loops for one kernel table on one CPU (see `gemm.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Blocking {
    /// Steps of the reduction per block: a `kc × nr` micro-panel of `B` the size of L1d (less
    /// when L2 could not hold [`MIN_PANELS`] row panels of `A` of `kc` steps in the quarter
    /// `mc` takes). The x86 microtiles prefetch the micro-panel's rows ahead of their steps
    /// (`Simd::TILE_PREFETCH_STEPS`), so the panel need not stay in L1 beside the slice of `A`
    /// streaming past it, while every reduction block costs a pass of loads and stores over
    /// the tiles of `C`. (Where the cache sizes are not reported, as on AArch64, the fallback
    /// sizes' L2 bound decides kc.)
    pub kc: usize,
    /// Rows of `A` per work item (about; a multiple of `mr`): their `mc × kc` slab of packed
    /// `A`, which every micro-panel of `B` meets, fills a quarter of L2.
    pub mc: usize,
    /// Columns of `C` per chunk (a multiple of `nr`): the `mc × nc` chunk, updated once per
    /// reduction block, fills another quarter of L2.
    pub nc: usize,
}

impl Blocking {
    /// The blocks for `kernels` on a CPU with `caches`.
    pub(crate) fn new(kernels: &Kernels, caches: CacheSizes) -> Blocking {
        let (mr, nr) = (kernels.mr, kernels.nr);
        let floats = |bytes: usize| bytes / size_of::<f32>();
        let l1_steps = floats(caches.l1d) / nr;
        let l2_steps = floats(caches.l2 / 4) / (MIN_PANELS * mr);
        let kc = l1_steps.min(l2_steps).clamp(64, 512) / 16 * 16;
        let mc = (floats(caches.l2 / 4) / kc).clamp(mr, 1024) / mr * mr;
        let nc = (floats(caches.l2 / 4) / mc).clamp(nr, 4096) / nr * nr;
        Blocking { kc, mc, nc }
    }

    /// Steps per reduction block for a reduction of `k`: the fewest blocks of at most
    /// `1.5 · kc` steps, as even as they can be. A short last block would cost a whole extra
    /// pass of loads and stores of `C` for little work.
    pub(crate) fn steps(&self, k: usize) -> usize {
        let blocks = k.div_ceil(self.kc + self.kc / 2).max(1);
        k.div_ceil(blocks).max(1)
    }

    /// The blocks for `kernels` on this CPU.
    pub(crate) fn detect(kernels: &Kernels) -> Blocking {
        Blocking::new(kernels, CacheSizes::detect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::Isa;
    use alloc::format;

    /// Whatever the caches, the blocks are whole panels, whole 16-step runs and at least one
    /// of each.
    #[test]
    fn blocks_are_whole_panels_for_any_caches() {
        for isa in Isa::ALL.into_iter().filter(|isa| isa.is_supported()) {
            let kernels = isa.kernels().unwrap();
            for l1d in [0, 1 << 10, 16 << 10, 48 << 10, 1 << 20, usize::MAX / 8] {
                for l2 in [0, 64 << 10, 1 << 20, 2 << 20, usize::MAX / 8] {
                    let b = Blocking::new(kernels, CacheSizes { l1d, l2 });
                    let context = format!("{isa:?} l1d {l1d} l2 {l2}: {b:?}");
                    assert!(b.kc >= 64 && b.kc.is_multiple_of(16), "{context}");
                    assert!(
                        b.mc >= kernels.mr && b.mc.is_multiple_of(kernels.mr),
                        "{context}"
                    );
                    assert!(
                        b.nc >= kernels.nr && b.nc.is_multiple_of(kernels.nr),
                        "{context}"
                    );
                }
            }
        }
    }

    /// Reduction blocks cover `k` in the fewest blocks of at most `1.5 · kc` steps, their
    /// sizes at most one apart.
    #[test]
    fn reduction_blocks_are_few_and_even() {
        let b = Blocking {
            kc: 192,
            mc: 336,
            nc: 192,
        };
        for k in 0..2000 {
            let steps = b.steps(k);
            let blocks = k.div_ceil(steps);
            assert!((1..=288).contains(&steps), "k {k}: {steps}");
            assert_eq!(blocks, k.div_ceil(288), "k {k}: {steps} steps");
            if blocks > 0 {
                let last = k - (blocks - 1) * steps;
                assert!(steps - last < blocks, "k {k}: {steps} steps, last {last}");
            }
        }
    }

    /// What this CPU reports, when it reports both levels, lies within the sizes of real
    /// caches, and detection gives it (or the fallback when it reports nothing).
    #[test]
    fn detection_gives_the_reported_sizes_or_the_fallback() {
        let reported = reported();
        if let Some(sizes) = reported {
            assert!((4 << 10..=4 << 20).contains(&sizes.l1d), "{sizes:?}");
            assert!((32 << 10..=256 << 20).contains(&sizes.l2), "{sizes:?}");
        }
        assert_eq!(
            CacheSizes::detect(),
            reported.unwrap_or(CacheSizes::FALLBACK)
        );
    }
}
