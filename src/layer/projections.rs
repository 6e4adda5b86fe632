//! The weights of a layer whose widths are numbers: the four projections as the caller gives
//! them ([`Projections`], borrowed), their optional biases ([`Biases`]), and the projections
//! packed for the kernels.

use alloc::vec::Vec;
use core::fmt;

use crate::error::{check_dimension, ShapeError};
use crate::kernels::buffer::run_time_len;
use crate::kernels::format::weights::{MatrixRef, WeightSlice};
use crate::kernels::gemm::packed::{check_block_width, check_range, Part};
use crate::kernels::gemm::PackedPieces;
use crate::kernels::{Compute, Kernels, PackedB, WeightFormat, WeightValues};

/// The widths of an attention layer.
///
/// `d_model` (`D`) is the width of the input tokens and of the output, `memory` (`E`) the
/// width of the tokens keys and values are projected from (`D` for self-attention, the
/// memory's width for cross-attention), `query` (`Q`) the query width `n_heads · head_dim`
/// (`D` unless the heads are not `D / n_heads` wide, as in Qwen3 or Gemma) and `kv` (`KV`)
/// the key/value width `n_kv_heads · head_dim` (`Q`, or less for grouped-query attention).
/// `value` (`V`) is the width of the values, `n_kv_heads · dv`: `KV` unless the value heads
/// are `dv` wide instead of `head_dim` (MiMo-V2-Flash: keys of 192, values of 128; set by
/// [`with_value_width`](Self::with_value_width)). Then `Wv` is `(E, V)`, the merged heads
/// and an output gate's span are `H · dv` ([`merged`](Self::merged)) and `Wo` is
/// `(H · dv, D)`.
///
/// ```
/// use mha::Widths;
/// // A Llama-3-8B layer: D 4096, 32 query heads and 8 key/value heads of 128.
/// let widths = Widths::self_attention(4096, 8 * 128, 32 * 128);
/// assert_eq!((widths.memory, widths.kv, widths.value), (4096, 1024, 1024));
/// // Query and key heads of 192, value heads of 128: 64 query heads, 4 key/value heads.
/// let widths = Widths::self_attention(4096, 4 * 192, 64 * 192).with_value_width(4 * 128);
/// assert_eq!((widths.value, widths.merged()), (512, 64 * 128));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Widths {
    /// The model width `D`.
    pub d_model: usize,
    /// The width `E` of the tokens keys and values come from.
    pub memory: usize,
    /// The key/value width `KV`.
    pub kv: usize,
    /// The query width `Q`.
    pub query: usize,
    /// The value width `V` (`KV` unless the value heads are not `head_dim` wide).
    pub value: usize,
}

impl Widths {
    /// The widths of self-attention: keys and values come from the `d_model`-wide input,
    /// and the value heads are as wide as the key heads (`V = KV`).
    pub const fn self_attention(d_model: usize, kv: usize, query: usize) -> Self {
        Widths {
            d_model,
            memory: d_model,
            kv,
            query,
            value: kv,
        }
    }

    /// These widths with values `value` wide (`V = n_kv_heads · dv`, for value heads of `dv`
    /// features beside key heads of `head_dim`). [`Projections`] check `Wv (E, V)` and `Wo
    /// (H · dv, D)`, the layer's builder that `V` is a whole number of `dv` per key/value
    /// head.
    pub const fn with_value_width(self, value: usize) -> Self {
        Widths { value, ..self }
    }

    /// The width of the merged heads, `H · dv = Q · V / KV`: the rows of `Wo` (`Q` when the
    /// value heads are as wide as the key heads; `0` when `Q` is not a whole number of
    /// `KV`-wide groups, which no layer builds).
    pub const fn merged(&self) -> usize {
        if self.value == self.kv {
            self.query
        } else if self.kv == 0 || !self.query.is_multiple_of(self.kv) {
            0
        } else {
            self.query / self.kv * self.value
        }
    }

    /// `Err(ValueWidth)` when the values are not `KV` wide and the merged width is not
    /// defined: no key/value heads, or `Q` not a whole number of `KV`-wide groups.
    fn check_value(&self) -> Result<(), ShapeError> {
        if self.value == self.kv || self.merged() != 0 {
            return Ok(());
        }
        Err(ShapeError::ValueWidth {
            value_width: self.value,
            kv_width: self.kv,
            q_width: self.query,
        })
    }

    /// Whether keys and values come from the input tokens (`E = D`).
    pub(crate) fn is_self_attention(&self) -> bool {
        self.memory == self.d_model
    }
}

/// The four weight matrices of one attention layer, borrowed, row-major in the `x @ W`
/// convention (rows are input features): `wq (D, Q)`, `wk (E, KV)`, `wv (E, V)`, `wo (M, D)`
/// for the [`Widths`] `D, E, KV, Q, V` (`V = KV` and `M = Q` unless the value heads differ
/// from the key heads: `M` is [`Widths::merged`]). A layer packs them when it is built and keeps no
/// reference to them.
///
/// A `&MhaParams` converts into one; [`from_values`](Self::from_values) borrows matrices
/// kept in their stored 16-bit format. Its `Debug` shows the widths, not the values.
///
/// ```
/// use mha::{Projections, Widths};
/// let widths = Widths::self_attention(4, 2, 4);
/// let (wq, wk, wv, wo) = (vec![0.0; 16], vec![0.0; 8], vec![0.0; 8], vec![0.0; 16]);
/// let projections = Projections::new(widths, &wq, &wk, &wv, &wo)?;
/// assert_eq!(projections.widths(), widths);
/// let err = Projections::new(widths, &wq, &wq, &wv, &wo).unwrap_err();
/// assert_eq!(err.to_string(), "key projection wk (E, KV) needs 8 elements, but the buffer has 16");
/// # Ok::<(), mha::ShapeError>(())
/// ```
#[derive(Clone, Copy)]
pub struct Projections<'a> {
    widths: Widths,
    wq: MatrixRef<'a>,
    wk: MatrixRef<'a>,
    wv: MatrixRef<'a>,
    wo: MatrixRef<'a>,
    /// Whether `wk` and `wv` are the layer's: false for a KV-shared layer
    /// ([`queries_only`](Projections::queries_only)), whose `wk` and `wv` are empty.
    keys_values: bool,
}

impl fmt::Debug for Projections<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Projections")
            .field("widths", &self.widths)
            .finish_non_exhaustive()
    }
}

impl<'a> Projections<'a> {
    /// The projections `wq (D, Q)`, `wk (E, KV)`, `wv (E, V)` and `wo (M, D)` of a layer of
    /// `widths` (`M` = [`Widths::merged`]).
    ///
    /// # Errors
    /// [`ShapeError::LengthMismatch`] naming the matrix and both lengths when one does not
    /// hold its shape, [`ShapeError::Overflow`] when a shape's product overflows,
    /// [`ShapeError::ValueWidth`] when `V ≠ KV` and `Q` is not whole `KV`-wide groups.
    pub fn new(
        widths: Widths,
        wq: &'a [f32],
        wk: &'a [f32],
        wv: &'a [f32],
        wo: &'a [f32],
    ) -> Result<Self, ShapeError> {
        let [wq, wk, wv, wo] = [wq, wk, wv, wo].map(|w| MatrixRef::Values(WeightSlice::F32(w)));
        Self::checked(widths, [wq, wk, wv, wo])
    }

    /// The projections `wq (D, Q)`, `wk (E, KV)`, `wv (E, V)` and `wo (M, D)` of a layer of
    /// `widths`, each in the format it is stored in (as a
    /// [`LayerWeights`](crate::LayerWeights) holds them: values in the `x @ W` layout, or
    /// ggml's blocks of each output). A layer built in a matrix's own format packs its values
    /// or blocks as they are.
    ///
    /// ```
    /// use mha::{Projections, WeightValues, Widths};
    /// let widths = Widths::self_attention(2, 2, 2);
    /// let w = WeightValues::Bf16(vec![0x3f80; 4]);
    /// let projections = Projections::from_values(widths, [&w, &w, &w, &w])?;
    /// assert_eq!(projections.widths(), widths);
    /// let short = WeightValues::Bf16(vec![0x3f80; 3]);
    /// assert!(Projections::from_values(widths, [&w, &short, &w, &w]).is_err());
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    ///
    /// # Errors
    /// As [`new`](Self::new); for blocks, [`ShapeError::LengthMismatch`] also when their
    /// inputs are not the matrix's or their bytes are not whole outputs of blocks.
    pub fn from_values(
        widths: Widths,
        matrices: [&'a WeightValues; 4],
    ) -> Result<Self, ShapeError> {
        Self::checked(widths, matrices.map(WeightValues::as_matrix))
    }

    /// The projections `[wq, wk, wv, wo]`, each checked to hold its shape.
    fn checked(widths: Widths, [wq, wk, wv, wo]: [MatrixRef<'a>; 4]) -> Result<Self, ShapeError> {
        let Widths {
            d_model,
            memory,
            kv,
            query,
            value,
        } = widths;
        widths.check_value()?;
        check_matrix("query projection wq (D, Q)", wq, [d_model, query])?;
        check_matrix("key projection wk (E, KV)", wk, [memory, kv])?;
        check_matrix(VALUE, wv, [memory, value])?;
        check_matrix(OUTPUT, wo, [widths.merged(), d_model])?;
        Ok(Projections {
            widths,
            wq,
            wk,
            wv,
            wo,
            keys_values: true,
        })
    }

    /// The projections of a **KV-shared** layer: `wq (D, Q)` and `wo (Q, D)` only, no key or
    /// value projection. Such a layer attends over the keys and values another layer of the
    /// same key/value shape has cached for the same tokens (Gemma 3n's and Gemma 4's last
    /// `num_kv_shared_layers` layers), read in place, never copied:
    /// [`Layer::decode_shared_into`](crate::Layer::decode_shared_into) over a
    /// [`KvCache`](crate::KvCache), [`Layer::decode_shared_paged`](crate::Layer::decode_shared_paged)
    /// over a [`PagedCache`](crate::PagedCache). `widths.kv` is still the source's `KV`
    /// (`n_kv_heads · head_dim`), checked against its caches at each call. Each matrix is
    /// in its stored format, as in [`from_values`](Self::from_values) (`WeightValues::F32`
    /// for plain `f32`).
    ///
    /// ```
    /// use mha::{Layer, Projections, WeightValues, Widths};
    /// let widths = Widths::self_attention(4, 2, 4);
    /// let w = WeightValues::F32(vec![0.1; 16]);
    /// let shared = Layer::builder(Projections::queries_only(widths, [&w, &w])?, 2).build()?;
    /// assert!(shared.is_kv_shared());
    /// assert_eq!(shared.weight_bytes(), 2 * 16 * 4);
    /// # Ok::<(), mha::ShapeError>(())
    /// ```
    ///
    /// # Errors
    /// [`ShapeError::DimensionMismatch`] when `widths` are not self-attention's (`E ≠ D`);
    /// as [`from_values`](Self::from_values) for `wq` and `wo`.
    pub fn queries_only(
        widths: Widths,
        [wq, wo]: [&'a WeightValues; 2],
    ) -> Result<Self, ShapeError> {
        let [wq, wo] = [wq, wo].map(WeightValues::as_matrix);
        check_dimension(
            "memory width (E) of a KV-shared layer",
            widths.d_model,
            widths.memory,
        )?;
        check_matrix(
            "query projection wq (D, Q)",
            wq,
            [widths.d_model, widths.query],
        )?;
        widths.check_value()?;
        check_matrix(OUTPUT, wo, [widths.merged(), widths.d_model])?;
        let none = MatrixRef::Values(WeightSlice::F32(&[]));
        Ok(Projections {
            widths,
            wq,
            wk: none,
            wv: none,
            wo,
            keys_values: false,
        })
    }

    /// The layer's own matrices (not a KV-shared layer's empty `wk` and `wv`), each with its
    /// name and input width.
    fn matrices(&self) -> impl Iterator<Item = (&'static str, usize, MatrixRef<'a>)> {
        let Widths {
            d_model, memory, ..
        } = self.widths;
        let own = [true, self.keys_values, self.keys_values, true];
        let matrices = [
            ("query projection wq (D, Q)", d_model, self.wq),
            ("key projection wk (E, KV)", memory, self.wk),
            (VALUE, memory, self.wv),
            (OUTPUT, self.widths.merged(), self.wo),
        ];
        matrices
            .into_iter()
            .zip(own)
            .filter(|(_, own)| *own)
            .map(|(m, _)| m)
    }

    /// Whether these are a KV-shared layer's ([`queries_only`](Self::queries_only)).
    pub fn is_kv_shared(&self) -> bool {
        !self.keys_values
    }

    /// The projections of a typed [`MhaParams`](crate::MhaParams), whose matrices hold their
    /// shapes by construction.
    pub(crate) fn of_typed(widths: Widths, [wq, wk, wv, wo]: [&'a [f32]; 4]) -> Self {
        debug_assert!(Self::new(widths, wq, wk, wv, wo).is_ok());
        let [wq, wk, wv, wo] = [wq, wk, wv, wo].map(|w| MatrixRef::Values(WeightSlice::F32(w)));
        Projections {
            widths,
            wq,
            wk,
            wv,
            wo,
            keys_values: true,
        }
    }

    /// The widths of the layer these weights make.
    pub fn widths(&self) -> Widths {
        self.widths
    }
}

/// What the value projection is called in errors.
const VALUE: &str = "value projection wv (E, V)";
/// What the output projection is called in errors.
const OUTPUT: &str = "output projection wo (H·dv, D)";

/// `Err(LengthMismatch)` unless `matrix` holds the `(inputs, outputs)` matrix `dims` of
/// `what`: as many values, or blocks of exactly `inputs` values for `outputs` outputs.
fn check_matrix(
    what: &'static str,
    matrix: MatrixRef<'_>,
    dims: [usize; 2],
) -> Result<(), ShapeError> {
    let blocks = match matrix {
        MatrixRef::Values(values) => return check_values(what, values, &dims),
        MatrixRef::Blocks(blocks) => blocks,
    };
    let expected = run_time_len::<u8>(what, &[dims[1], blocks.row_bytes()])?;
    let whole = blocks.k.is_multiple_of(blocks.quant.values());
    if blocks.k == dims[0] && whole && blocks.bytes.len() == expected {
        return Ok(());
    }
    Err(ShapeError::LengthMismatch {
        what,
        expected: run_time_len::<f32>(what, &dims)?,
        actual: blocks.rows() * blocks.k,
    })
}

/// `Err(LengthMismatch)` unless `values` holds the `dims` of `what`.
pub(crate) fn check_values<'a>(
    what: &'static str,
    values: impl Into<WeightSlice<'a>>,
    dims: &[usize],
) -> Result<(), ShapeError> {
    let values = values.into();
    let expected = run_time_len::<f32>(what, dims)?;
    if values.len() == expected {
        Ok(())
    } else {
        Err(ShapeError::LengthMismatch {
            what,
            expected,
            actual: values.len(),
        })
    }
}

/// Optional projection biases of a layer whose widths are numbers: `Q = x·Wq + bq`,
/// `K = x·Wk + bk`, `V = x·Wv + bv`, `y = merged·Wo + bo`, with `bq` `Q` values, `bk` `KV`
/// values, `bv` `V` values and `bo` `D` values (checked when the layer is built). An
/// [`MhaBiases`](crate::MhaBiases) converts into one.
///
/// ```
/// let biases = mha::Biases { bo: Some(vec![0.5; 4]), ..mha::Biases::default() };
/// assert!(biases.bq.is_none());
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Biases {
    /// Query bias, `Q` values.
    pub bq: Option<Vec<f32>>,
    /// Key bias, `KV` values.
    pub bk: Option<Vec<f32>>,
    /// Value bias, `V` values.
    pub bv: Option<Vec<f32>>,
    /// Output bias, `D` values.
    pub bo: Option<Vec<f32>>,
}

impl Biases {
    /// Checks each bias's length against `widths`.
    ///
    /// # Errors
    /// [`ShapeError::LengthMismatch`] naming the bias and both lengths.
    pub(crate) fn check(&self, widths: Widths) -> Result<(), ShapeError> {
        let wanted = [
            ("query bias bq (Q)", widths.query),
            ("key bias bk (KV)", widths.kv),
            ("value bias bv (V)", widths.value),
            ("output bias bo (D)", widths.d_model),
        ];
        for ((what, len), bias) in wanted.into_iter().zip(self.rows()) {
            if let Some(bias) = bias {
                check_values(what, bias, &[len])?;
            }
        }
        Ok(())
    }

    /// `[bq, bk, bv, bo]` as plain rows.
    pub(crate) fn rows(&self) -> [Option<&[f32]>; 4] {
        [&self.bq, &self.bk, &self.bv, &self.bo].map(Option::as_deref)
    }
}

/// How a layer keeps its projection weights ([`LayerBuilder::weight_format`] and
/// [`LayerBuilder::stored_weight_formats`](crate::LayerBuilder::stored_weight_formats)).
///
/// [`LayerBuilder::weight_format`]: crate::LayerBuilder::weight_format
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WeightFormats {
    /// Every matrix in one format (rounded, quantized or widened to it).
    In(WeightFormat),
    /// Each matrix in the format it is given in (an output gate's `f32`).
    AsStored,
}

/// The weights packed for the kernels.
#[derive(Debug)]
pub(crate) struct PackedWeights {
    /// `[Wq | Wk | Wv]` (`(D, Q + KV + V)`) when `E = D`, else `Wq`; followed by the output
    /// gate's `Wg (D, G)` when the layer has one. One piece in one format, or (the matrices'
    /// formats kept and differing) one piece per matrix.
    pub projection: PackedPieces,
    /// `[Wk | Wv]`, when it is not a window of `projection` (a window must start on a panel
    /// boundary, or a piece's first column).
    pub memory_projection: Option<PackedPieces>,
    /// `Wo`, `(H·dv, D)`.
    pub output: PackedB,
    /// The formats `Wq`, `Wk`, `Wv`, `Wo` and `Wg` are kept in.
    pub formats: [WeightFormat; 5],
}

/// The matrices of a layer as the packed forms take them: `[Wq | Wk | Wv (| Wg)]` (or
/// `[Wq (| Wg)]`, `Wv` left out when the values are the keys), the `[Wk | Wv]` of the keys'
/// source, `Wo`; and the checked matrices with what errors call them.
struct LayerParts<'a> {
    x: Vec<Part<'a>>,
    /// `[Wk | Wv]` (or `[Wk]`), when the layer projects keys and values.
    kv: Option<Vec<Part<'a>>>,
    wo: Part<'a>,
    /// `(D, E, H·dv)`: the inputs of `x`, `kv` and `wo`.
    inputs: (usize, usize, usize),
    /// `[Wq, Wk, Wv, Wo, Wg]`, those the layer has.
    all: [Option<Part<'a>>; 5],
}

impl<'a> LayerParts<'a> {
    fn new(
        (p, values_from_keys): (&Projections<'a>, bool),
        gate: Option<(&'a [f32], usize)>,
    ) -> Self {
        let widths = p.widths;
        let part = |values, width| Part { values, width };
        let wq = part(p.wq, widths.query);
        let wk = part(p.wk, widths.kv);
        let wv = part(p.wv, widths.value);
        let wg =
            gate.map(|(values, width)| part(MatrixRef::Values(WeightSlice::F32(values)), width));
        // `[Wq | Wk | Wv (| Wg)]` for self-attention; `[Wq (| Wg)]` when the keys and values
        // come from elsewhere (cross-attention's memory, a KV-shared layer's source).
        let x_projects_kv = widths.is_self_attention() && p.keys_values;
        // Values from the keys: `Wv` is not packed (`[Wq | Wk (| Wg)]`, `[Wk]`).
        let mut x = alloc::vec![wq];
        if x_projects_kv {
            x.push(wk);
            if !values_from_keys {
                x.push(wv);
            }
        }
        x.extend(wg);
        let kv_parts = if values_from_keys {
            alloc::vec![wk]
        } else {
            alloc::vec![wk, wv]
        };
        let (own_k, own_v) = (p.keys_values, p.keys_values && !values_from_keys);
        LayerParts {
            x,
            kv: p.keys_values.then_some(kv_parts),
            wo: part(p.wo, widths.d_model),
            inputs: (widths.d_model, widths.memory, widths.merged()),
            all: [
                Some(wq),
                own_k.then_some(wk),
                own_v.then_some(wv),
                Some(part(p.wo, widths.d_model)),
                wg,
            ],
        }
    }

    /// The one format all the matrices are stored in, if they are.
    fn common_format(&self) -> Option<WeightFormat> {
        let mut formats = self.all.iter().flatten().map(|part| part.values.format());
        let first = formats.next()?;
        formats.all(|f| f == first).then_some(first)
    }
}

impl PackedWeights {
    /// Packs the weights of `p` from their row-major matrices, and the output gate's `(D, G)`
    /// `gate` when given as `(weights, G)`, in `formats`, for the products of `compute`.
    ///
    /// # Errors
    /// [`ShapeError::BlockWidth`] naming the matrix when its input width is not whole blocks
    /// of a block `format`, [`ShapeError::NotQuantizable`] for a block format without a
    /// quantizer, [`ShapeError::WeightRange`] naming the matrix when a finite weight rounds
    /// to an infinity in `format` (a block's scale, in a block format),
    /// [`ShapeError::AllocationFailed`] when a packed matrix cannot be
    /// allocated; [`ShapeError::Setting`] for [`Compute::Int8`] with another format than
    /// `q8_0` or `q4_0`.
    pub(crate) fn new(
        kernels: &'static Kernels,
        p: (&Projections<'_>, bool),
        gate: Option<(&[f32], usize)>,
        formats: WeightFormats,
        compute: Compute,
    ) -> Result<Self, ShapeError> {
        let parts = LayerParts::new(p, gate);
        let format = match formats {
            WeightFormats::In(format) => Some(format),
            WeightFormats::AsStored => parts.common_format(),
        };
        match format {
            Some(format) => Self::in_format(kernels, p.0, &parts, format, compute),
            None => Self::as_stored(kernels, p.0.widths, &parts, compute),
        }
    }

    /// [`new`](Self::new) with every matrix in `format`.
    fn in_format(
        kernels: &'static Kernels,
        p: &Projections<'_>,
        parts: &LayerParts<'_>,
        format: WeightFormat,
        compute: Compute,
    ) -> Result<Self, ShapeError> {
        for (what, width, _) in p.matrices() {
            check_block_width(what, width, format)?;
        }
        let gate = parts.all[4].map(|g| ("output gate wg (D, G)", 0, g.values));
        for (what, _, matrix) in p.matrices().chain(gate) {
            if let MatrixRef::Values(values) = matrix {
                check_range(what, values, format)?;
            }
        }
        let pack = |k, parts: &[Part<'_>]| PackedB::pack(kernels, k, parts, format, compute);
        let (d_model, memory, merged) = parts.inputs;
        let projection = pack(d_model, &parts.x)?;
        // The keys' columns of `projection` start on a panel boundary when Q is whole panels.
        let window = p.widths.is_self_attention() && p.widths.query.is_multiple_of(kernels.nr);
        let memory_projection = match &parts.kv {
            Some(kv) if !window => Some(PackedPieces::one(pack(memory, kv)?)),
            _ => None,
        };
        let output = pack(merged, &[parts.wo])?;
        Ok(PackedWeights {
            projection: PackedPieces::one(projection),
            memory_projection,
            formats: [output.format(); 5],
            output,
        })
    }

    /// [`new`](Self::new) with each matrix in its own stored format (their formats differ):
    /// one piece per matrix, so the keys' columns of the projection start a piece.
    fn as_stored(
        kernels: &'static Kernels,
        widths: Widths,
        parts: &LayerParts<'_>,
        compute: Compute,
    ) -> Result<Self, ShapeError> {
        let one =
            |k, part: &Part<'_>| PackedB::pack(kernels, k, &[*part], part.values.format(), compute);
        let pieces = |k, parts: &[Part<'_>]| -> Result<PackedPieces, ShapeError> {
            let packed = parts
                .iter()
                .map(|part| one(k, part))
                .collect::<Result<_, _>>()?;
            Ok(PackedPieces::new(packed).expect("a projection has at least Wq or Wk"))
        };
        let (d_model, memory, merged) = parts.inputs;
        let memory_projection = match &parts.kv {
            Some(kv) if !widths.is_self_attention() => Some(pieces(memory, kv)?),
            _ => None,
        };
        let stored = |i: usize| parts.all[i].map_or(WeightFormat::F32, |p| p.values.format());
        Ok(PackedWeights {
            projection: pieces(d_model, &parts.x)?,
            memory_projection,
            output: one(merged, &parts.wo)?,
            formats: [0, 1, 2, 3, 4].map(stored),
        })
    }

    /// The packed `[Wk | Wv]` and the column it starts at (after the `q_width` columns of
    /// `Wq`).
    pub(crate) fn key_value(&self, q_width: usize) -> (&PackedPieces, usize) {
        match &self.memory_projection {
            Some(packed) => (packed, 0),
            None => (&self.projection, q_width),
        }
    }

    /// The kernels the weights are packed for.
    pub(crate) fn kernels(&self) -> &'static Kernels {
        self.output.kernels()
    }
}
