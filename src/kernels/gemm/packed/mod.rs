//! [`PackedB`]: the `B` of a GEMM packed once for one instruction set's microkernels, in
//! panels of `nr` columns, each stored step by step, in `f32` or a 16-bit
//! [`WeightFormat`] (each value rounded once, to nearest, ties to even, when packed); or, in
//! a block format, as ggml's blocks along each column (`format/blocks.rs`), the columns
//! interleaved one vector's lanes at a time, widened by the kernels a micro-panel at a time
//! (prefill) or in registers (a few rows); or in the int8 or AMX panels of a [`Compute`].
//! This file holds the type and how the GEMM reads it; `build.rs` how it is made.

mod build;

pub(crate) use build::{check_block_width, check_range, Part};

use alloc::vec::Vec;

use crate::kernels::format::blocks::BlockRows;
use crate::kernels::format::formats::Storage;
use crate::kernels::format::{Compute, Elements, Panels, Place, Stored, WeightFormat};
use crate::kernels::gemm::bf16::AmxPanels;
use crate::kernels::gemm::blocking::Blocking;
use crate::kernels::gemm::int8::Int8Panels;
use crate::kernels::{Isa, Kernels};

/// What the packed form of a matrix is called in errors.
const PACKED: &str = "packed matrix B (k, panels, panel width)";

/// A `(k, n)` matrix packed for the microkernels of one instruction set: panels of `nr`
/// columns (the last zero-padded), each panel stored step by step (`nr` values per `p`), in
/// `f32` or a 16-bit [`WeightFormat`] that the kernels widen exactly; or, in a block format,
/// the blocks of its `n` columns (a GGUF tensor's `(out, in)` rows, interleaved in groups of
/// one vector's lanes), widened by the kernels to ggml's dequantized values.
#[derive(Clone)]
pub struct PackedB {
    k: usize,
    n: usize,
    kernels: &'static Kernels,
    format: WeightFormat,
    compute: Compute,
    data: Data,
}

/// What a [`PackedB`] holds.
#[derive(Clone)]
enum Data {
    /// The panels' elements, in its format (`n` rounded up to whole panels, times `k`).
    Panels(Elements),
    /// The `k / values` blocks of each column, the columns in interleaved groups of the
    /// table's `lanes` (the last padded with zero columns; [`BlockRows`]).
    Blocks(Vec<u8>),
    /// `q8_0` or `q4_0` blocks as 8-bit integers for the int8 tile ([`Compute::Int8`]).
    Int8(Int8Panels),
    /// bfloat16 in AMX's layout ([`Compute::Bf16`] on a table with AMX).
    Amx(AmxPanels),
}

/// The shape and instruction set, not the values.
impl core::fmt::Debug for PackedB {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PackedB")
            .field("k", &self.k)
            .field("n", &self.n)
            .field("isa", &self.kernels.isa)
            .field("format", &self.format())
            .field("compute", &self.compute())
            .finish_non_exhaustive()
    }
}

impl PackedB {
    /// The reduction length `k` (rows of `B`).
    pub fn rows(&self) -> usize {
        self.k
    }

    /// The number of columns `n`.
    pub fn cols(&self) -> usize {
        self.n
    }

    /// The instruction set this matrix was packed for.
    pub fn isa(&self) -> Isa {
        self.kernels.isa
    }

    /// The kernel table this matrix was packed for.
    pub(crate) fn kernels(&self) -> &'static Kernels {
        self.kernels
    }

    /// The format its values are stored in.
    pub fn format(&self) -> WeightFormat {
        self.format
    }

    /// The arithmetic of its products.
    pub fn compute(&self) -> Compute {
        self.compute
    }

    /// Its AMX panels, when its products are [`Compute::Bf16`] on a table with AMX.
    pub(crate) fn amx(&self) -> Option<&AmxPanels> {
        match &self.data {
            Data::Amx(panels) => Some(panels),
            _ => None,
        }
    }

    /// Its int8 panels, when its products are [`Compute::Int8`].
    pub(crate) fn int8(&self) -> Option<&Int8Panels> {
        match &self.data {
            Data::Int8(panels) => Some(panels),
            _ => None,
        }
    }

    /// The bytes of the packed panels (whole panels of `nr` columns) or blocks.
    pub(crate) fn bytes(&self) -> usize {
        match &self.data {
            Data::Panels(elements) => elements.bytes(),
            Data::Blocks(bytes) => bytes.len(),
            Data::Int8(panels) => panels.bytes(),
            Data::Amx(panels) => panels.bytes(),
        }
    }

    /// Its blocks, when it holds blocks rather than panels (which a few rows multiply in
    /// registers: [`Kernels::gemv_blocks`]).
    pub(crate) fn blocks(&self) -> Option<BlockRows<'_>> {
        match (&self.data, self.format.storage()) {
            (Data::Blocks(bytes), Storage::Blocks(quant)) => Some(BlockRows {
                quant,
                bytes,
                k: self.k,
                group: self.kernels.lanes,
            }),
            _ => None,
        }
    }

    /// Steps per reduction block over it: `blocking`'s, in whole blocks for a block format.
    pub(crate) fn steps(&self, blocking: &Blocking) -> usize {
        let steps = blocking.steps(self.k);
        match self.format.storage() {
            Storage::Element(_) => steps,
            Storage::Blocks(quant) => steps.next_multiple_of(quant.values()),
        }
    }

    /// The values a widened micro-panel takes (0 for `f32` panels, used in place).
    pub(crate) fn widened_len(&self, blocking: &Blocking) -> usize {
        match self.format {
            WeightFormat::F32 => 0,
            _ => self.steps(blocking) * self.kernels.nr,
        }
    }

    /// Steps `p0 .. p0 + kc` of panel `panel` as `f32`, a `kc × nr` micro-panel: `f32` panels
    /// in place, others widened into `buffer` (which holds [`widened_len`](Self::widened_len)
    /// values; `p0` and `kc` whole blocks in a block format).
    pub(crate) fn widened_micro_panel<'a>(
        &'a self,
        panel: usize,
        p0: usize,
        kc: usize,
        buffer: &'a mut [f32],
    ) -> &'a [f32] {
        let nr = self.kernels.nr;
        let src = match &self.data {
            Data::Panels(_) => {
                let stored = self.micro_panel(panel, p0, kc);
                if let Some(values) = stored.as_f32() {
                    return values;
                }
                // SAFETY: a checked kernel table; `stored` holds kc rows of nr values, as
                // does `buffer`.
                unsafe { (self.kernels.widen)(stored, kc, nr, buffer, nr) };
                return &buffer[..kc * nr];
            }
            Data::Blocks(_) => self.blocks().expect("blocks are kept in a block format"),
            Data::Int8(_) | Data::Amx(_) => panic!("int8 and AMX panels are not widened"),
        };
        let (j0, width) = (panel * nr, nr.min(self.n - panel * nr));
        // SAFETY: a checked kernel table; the caller's steps are whole blocks inside the
        // matrix, the panel's columns are among its n, `buffer` holds kc · nr values.
        unsafe { (self.kernels.widen_blocks)(src, j0, width, p0, kc, buffer, nr) };
        &buffer[..kc * nr]
    }

    /// The packed values from step `p0` of panel `first` on, as `nr`-column panels of `k`
    /// steps (panel `first + q` at `q·k·nr`).
    ///
    /// # Panics
    /// When it holds blocks.
    pub(crate) fn panels_from(&self, first: usize, p0: usize) -> Stored<'_> {
        let nr = self.kernels.nr;
        let start = first * self.k * nr + p0 * nr;
        let data = self.panel_elements();
        let mut panels = data.matrix(rows_of(nr, start, (data.len() - start) / nr));
        panels.panels = Some(Panels {
            width: nr,
            len: self.k * nr,
        });
        panels
    }

    /// Steps `p0 .. p0 + kc` of panel `panel`: one contiguous `kc × nr` micro-panel.
    ///
    /// # Panics
    /// When it holds blocks.
    fn micro_panel(&self, panel: usize, p0: usize, kc: usize) -> Stored<'_> {
        let nr = self.kernels.nr;
        let start = panel * self.k * nr + p0 * nr;
        self.panel_elements().matrix(rows_of(nr, start, kc))
    }

    /// The panels' elements.
    ///
    /// # Panics
    /// When it holds blocks (the GEMM reads those through
    /// [`widened_micro_panel`](Self::widened_micro_panel)).
    fn panel_elements(&self) -> &Elements {
        match &self.data {
            Data::Panels(elements) => elements,
            Data::Blocks(_) | Data::Int8(_) | Data::Amx(_) => {
                panic!("a matrix in blocks or AMX panels has no f32 panels")
            }
        }
    }
}

/// `rows` rows of `nr` elements from `start`, contiguous.
fn rows_of(nr: usize, start: usize, rows: usize) -> Place {
    Place {
        start,
        rows,
        cols: nr,
        stride: nr,
        scale_start: 0,
        scale_rows: false,
        scale_stride: 0,
    }
}
