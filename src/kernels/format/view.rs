//! [`Stored`]: a matrix of stored elements as the kernels read it (the elements' slices, the
//! distance between rows, where `q8_0` scales are, and for packed panels where each group of
//! columns is).

use crate::kernels::format::element::Q8_BLOCK;
use crate::kernels::operands::fits;

/// The stored elements of a matrix, in their format.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Slices<'a> {
    /// `f32` values.
    F32(&'a [f32]),
    /// bfloat16 bits.
    Bf16(&'a [u16]),
    /// binary16 bits.
    F16(&'a [u16]),
    /// `q8_0` integers and where their scales are.
    Q8_0 {
        values: &'a [i8],
        scales: Q8Scales<'a>,
    },
}

/// Where the scale of element `(r, c)` of a `q8_0` matrix is.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Q8Scales<'a> {
    /// Blocks down the columns (a key panel: rows are features, columns keys):
    /// `scales[(r / 32) · stride + c]`.
    Columns { scales: &'a [f32], stride: usize },
    /// Blocks along the rows (value rows): `scales[r · stride + c / 32]`.
    Rows { scales: &'a [f32], stride: usize },
}

/// Columns in groups (the panels of a packed matrix): column `j` is column `j % width` of
/// group `j / width`, which starts `len` elements after the one before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Panels {
    /// Columns per group (a multiple of every instruction set's vector width).
    pub width: usize,
    /// Elements from one group's start to the next one's.
    pub len: usize,
}

/// A matrix of stored elements: element `(r, j)` at `r · stride + j` of the slices, or, in
/// [`Panels`], at `(j / width) · len + r · stride + j % width`. `q8_0` matrices are plain
/// rows (no panels). The kernels check that it holds what they read
/// ([`Stored::holds`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stored<'a> {
    pub slices: Slices<'a>,
    /// Elements between rows.
    pub stride: usize,
    /// The column groups, if the columns are in panels.
    pub panels: Option<Panels>,
}

impl<'a> Stored<'a> {
    /// Plain rows `stride` apart.
    pub(crate) fn rows(slices: Slices<'a>, stride: usize) -> Self {
        Stored {
            slices,
            stride,
            panels: None,
        }
    }

    /// `f32` rows `stride` apart.
    pub(crate) fn floats(values: &'a [f32], stride: usize) -> Self {
        Stored::rows(Slices::F32(values), stride)
    }

    /// The `f32` values, when it holds `f32` (to use in place).
    pub(crate) fn as_f32(self) -> Option<&'a [f32]> {
        match self.slices {
            Slices::F32(values) => Some(values),
            _ => None,
        }
    }

    /// Where column `j` of a row starts, from the row's start (`j` itself but in panels).
    #[inline(always)]
    pub(crate) fn column(self, j: usize) -> usize {
        match self.panels {
            None => j,
            Some(Panels { width, len }) => j / width * len + j % width,
        }
    }

    /// The matrix from row `r` on (its rows `r ..` as rows `0 ..`).
    ///
    /// # Panics
    /// When it has fewer rows.
    pub(crate) fn skip_rows(self, r: usize) -> Stored<'a> {
        let start = r * self.stride;
        let slices = match self.slices {
            Slices::F32(v) => Slices::F32(&v[start..]),
            Slices::Bf16(v) => Slices::Bf16(&v[start..]),
            Slices::F16(v) => Slices::F16(&v[start..]),
            Slices::Q8_0 { values, scales } => Slices::Q8_0 {
                values: &values[start..],
                scales: match scales {
                    // Whole blocks of rows only (keys are never read from a later feature).
                    Q8Scales::Columns { scales, stride } => Q8Scales::Columns {
                        scales: &scales[r / Q8_BLOCK * stride..],
                        stride,
                    },
                    Q8Scales::Rows { scales, stride } => Q8Scales::Rows {
                        scales: &scales[r * stride..],
                        stride,
                    },
                },
            },
        };
        Stored { slices, ..self }
    }

    /// The number of elements (scales not counted).
    fn len(self) -> usize {
        match self.slices {
            Slices::F32(v) => v.len(),
            Slices::Bf16(v) | Slices::F16(v) => v.len(),
            Slices::Q8_0 { values, .. } => values.len(),
        }
    }

    /// Whether it holds `rows × cols` elements (and their scales): every element `(r < rows,
    /// j < cols)` is inside the slices, in panels every group's rows end before the next
    /// group starts, and `q8_0` matrices are plain rows.
    pub(crate) fn holds(self, rows: usize, cols: usize) -> bool {
        if rows == 0 || cols == 0 {
            return true;
        }
        let last = rows - 1;
        let elements = match self.panels {
            None => fits(self.len(), last, self.stride, cols),
            Some(Panels { width, len }) => {
                // Each group's rows end before the next group (then `at` cannot overflow).
                let in_group = fits(len, last, self.stride, width);
                width > 0 && in_group && {
                    let (group, col) = ((cols - 1) / width, (cols - 1) % width);
                    fits(self.len(), group, len, last * self.stride + col + 1)
                }
            }
        };
        elements
            && match self.slices {
                Slices::Q8_0 { scales, .. } => {
                    self.panels.is_none() && scales_fit(scales, rows, cols)
                }
                _ => true,
            }
    }
}

/// Whether `scales` hold the scales of `rows × cols` elements (`rows`, `cols` > 0).
fn scales_fit(scales: Q8Scales<'_>, rows: usize, cols: usize) -> bool {
    match scales {
        Q8Scales::Columns { scales, stride } => {
            fits(scales.len(), (rows - 1) / Q8_BLOCK, stride, cols)
        }
        Q8Scales::Rows { scales, stride } => {
            fits(scales.len(), rows - 1, stride, cols.div_ceil(Q8_BLOCK))
        }
    }
}
