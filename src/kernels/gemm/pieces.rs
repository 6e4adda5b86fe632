//! [`PackedPieces`]: a matrix `B` made of column pieces side by side (`[Wq | Wk | Wv]`), each
//! a [`PackedB`] of its own format (a GGUF `Q4_K_M` layer's q4_K `Wq`, `Wk` beside its q6_K
//! `Wv`), and [`gemm_pieces`], the one place a GEMM over it is dispatched: each output segment
//! is a GEMM over the piece that holds its columns. Each element of `C` is a chain over its own
//! column of `B` alone, so cutting the columns into pieces changes no bit: the product has the
//! bits of the product with the one `f32` matrix of the pieces' widened values.

use alloc::vec::Vec;

use crate::kernels::gemm::packed::PackedB;
use crate::kernels::gemm::{gemm_with, GemmScratch, Output};
use crate::kernels::threads::parallel::Pool;

/// A `(k, n)` matrix `B` as column pieces side by side, each packed for the same kernel table
/// with the same `k`: piece `i` holds columns `start(i) .. start(i) + cols(i)`. One piece is a
/// plain [`PackedB`].
#[derive(Clone, Debug)]
pub(crate) struct PackedPieces {
    /// The pieces, left to right (none empty unless there is only one).
    pieces: Vec<PackedB>,
}

impl PackedPieces {
    /// The matrix `b`, one piece.
    pub(crate) fn one(b: PackedB) -> Self {
        PackedPieces {
            pieces: alloc::vec![b],
        }
    }

    /// The pieces side by side (those without columns dropped); `None` when there are none.
    ///
    /// # Panics
    /// When the pieces differ in `k` or kernel table (the caller packs them alike).
    pub(crate) fn new(pieces: Vec<PackedB>) -> Option<Self> {
        let first = pieces.first()?;
        let (k, isa) = (first.rows(), first.isa());
        assert!(
            pieces.iter().all(|p| p.rows() == k && p.isa() == isa),
            "pieces of one matrix share k and the kernel table"
        );
        let mut pieces = pieces;
        match pieces.iter().any(|p| p.cols() > 0) {
            true => pieces.retain(|p| p.cols() > 0),
            false => pieces.truncate(1),
        }
        Some(PackedPieces { pieces })
    }

    /// The bytes of every piece's packed form.
    pub(crate) fn bytes(&self) -> usize {
        self.pieces.iter().map(PackedB::bytes).sum()
    }

    /// The piece holding column `col` (`< n`) and the column it starts at.
    fn piece_at(&self, col: usize) -> (usize, &PackedB) {
        let mut start = 0;
        for piece in &self.pieces {
            if col < start + piece.cols() {
                return (start, piece);
            }
            start += piece.cols();
        }
        panic!("column {col} is past the {start} columns of the pieces")
    }
}

/// [`gemm_with`] over a matrix in pieces: `C = bias + A · B` for columns `first_col ..` of
/// `B`, into the `S` column segments `outputs`. One piece is one [`gemm_with`] call; with
/// several, each segment is a call over the piece holding its columns.
///
/// # Panics
/// With several pieces, when a segment's columns are not inside one piece from a multiple of
/// the table's panel width `nr` in it (the layer's segments are its pieces: `Q`, `K`, `V`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_pieces<const S: usize>(
    a: &[f32],
    lda: usize,
    m: usize,
    b: &PackedPieces,
    first_col: usize,
    outputs: [Output<'_>; S],
    scratch: &mut [GemmScratch],
    pool: &mut Pool,
) {
    if let [one] = &b.pieces[..] {
        return gemm_with(a, lda, m, one, first_col, outputs, scratch, pool);
    }
    let mut col = first_col;
    for output in outputs {
        let width = output.width;
        if width > 0 {
            let (start, piece) = b.piece_at(col);
            let offset = col - start;
            assert!(
                offset + width <= piece.cols() && offset.is_multiple_of(piece.kernels().nr),
                "segment of columns {col} .. {} across pieces",
                col + width
            );
            gemm_with(a, lda, m, piece, offset, [output], scratch, pool);
        }
        col += width;
    }
}
