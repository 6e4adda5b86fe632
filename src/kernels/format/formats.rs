//! The public element formats: [`KvFormat`] for a key/value store, [`WeightFormat`] for the
//! packed projection weights, each a choice among the [`Element`] formats.

use crate::kernels::format::blocks::Quant;
use crate::kernels::format::element::Element;

/// How a key/value store keeps the keys or the values of its tokens; set per layer with
/// [`LayerBuilder::kv_format`](crate::LayerBuilder::kv_format) (keys and values alike) or
/// [`key_format`](crate::LayerBuilder::key_format) and
/// [`value_format`](crate::LayerBuilder::value_format). The attention reads the stored
/// (rounded) values, widened to `f32` exactly, and a forward pass rounds its keys and values
/// the same way, so decoding token by token gives the forward pass's bits in every format.
///
/// ```
/// use mha::KvFormat;
/// assert_eq!(KvFormat::default(), KvFormat::F32);
/// // Bytes per value: 4, 2, 2, and 1 plus a 4-byte scale per block of 32.
/// assert_eq!(KvFormat::Q8_0.bytes_per_value(), 1.125);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvFormat {
    /// `f32`, as computed (the default).
    #[default]
    F32,
    /// bfloat16: 8 exponent bits, 8 significant bits; rounded to nearest, ties to even.
    Bf16,
    /// IEEE binary16 (half): 5 exponent bits, 11 significant bits; rounded to nearest, ties
    /// to even.
    F16,
    /// 8-bit blocks as llama.cpp's `q8_0`: per block of 32 values along the head dimension,
    /// an `f32` scale `max|x| / 127` and one `i8` per value (see the module docs of `format::element`).
    Q8_0,
}

impl KvFormat {
    /// Every format, widest first.
    pub const ALL: [KvFormat; 4] = [KvFormat::F32, KvFormat::Bf16, KvFormat::F16, KvFormat::Q8_0];

    /// Its name, as llama.cpp's cache types are spelled: `f32`, `bf16`, `f16`, `q8_0`.
    ///
    /// ```
    /// use mha::KvFormat;
    /// let named = |name: &str| KvFormat::ALL.into_iter().find(|f| f.name() == name);
    /// assert_eq!(named("q8_0"), Some(KvFormat::Q8_0));
    /// ```
    pub fn name(self) -> &'static str {
        self.element().name()
    }

    /// The average bytes per stored value (excluding the store's padding): 4, 2, 2, or
    /// `1 + 4 / 32` for [`KvFormat::Q8_0`] (its scale per block of 32).
    pub fn bytes_per_value(self) -> f64 {
        self.element().bytes_per_value()
    }

    /// Its element format.
    pub(crate) fn element(self) -> Element {
        match self {
            KvFormat::F32 => Element::F32,
            KvFormat::Bf16 => Element::Bf16,
            KvFormat::F16 => Element::F16,
            KvFormat::Q8_0 => Element::Q8_0,
        }
    }
}

/// How a layer keeps its projection weights (`Wq`, `Wk`, `Wv`, `Wo`); set with
/// [`LayerBuilder::weight_format`](crate::LayerBuilder::weight_format). A 16-bit format
/// rounds each `f32` weight once, to nearest, ties to even, when the layer is built, and the
/// kernels widen the stored values exactly, so a layer built from `f32` weights in
/// [`WeightFormat::Bf16`] gives the bits of one built in [`WeightFormat::F32`] from the same
/// weights rounded to bfloat16 first, with half the bytes. A checkpoint stored in bf16 or f16
/// loads in its own format ([`LayerWeights::format`](crate::LayerWeights::format)), which
/// loses nothing. Biases stay `f32`.
///
/// The block formats are llama.cpp's (ggml's) quantized types, kept with exactly the bytes a
/// GGUF tensor holds: each output's row of input weights in blocks of 32 (`q8_0`, `q4_0`) or
/// 256 values (`q4_K`, `q5_K`, `q6_K`), so the input width of every matrix must be a multiple
/// of the block. The kernels widen a block to the values of ggml's reference dequantization
/// (the same `f32` operations in the same order), so a layer gives the bits of the `f32`
/// layer built from the dequantized weights. `f32` weights are quantized to `q8_0` and
/// `q4_0` with ggml's reference quantizers (the same blocks, bit for bit); the K formats come
/// as blocks ([`PackedB::from_blocks`](crate::kernels::PackedB::from_blocks)).
///
/// ```
/// use mha::WeightFormat;
/// assert_eq!(WeightFormat::default(), WeightFormat::F32);
/// assert_eq!(WeightFormat::Bf16.bytes_per_value(), 2.0);
/// assert_eq!(WeightFormat::F16.name(), "f16");
/// // 18 bytes per block of 32 values.
/// assert_eq!(WeightFormat::Q4_0.bytes_per_value(), 18.0 / 32.0);
/// assert_eq!(WeightFormat::Q4_K.block_values(), 256);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)] // ggml's names: q4_K, not q4k.
pub enum WeightFormat {
    /// `f32` (the default).
    #[default]
    F32,
    /// bfloat16: 8 exponent bits, 8 significant bits.
    Bf16,
    /// IEEE binary16 (half): 5 exponent bits, 11 significant bits; finite weights must be
    /// below 65520 in magnitude (the layer's builder says which is not).
    F16,
    /// ggml's `q8_0`: blocks of 32 values, an `i8` each and a binary16 scale (8.5 bits per
    /// weight).
    Q8_0,
    /// ggml's `q4_0`: blocks of 32 values, a 4-bit integer each (offset 8) and a binary16
    /// scale (4.5 bits per weight).
    Q4_0,
    /// ggml's `q4_K`: blocks of 256 values, 4 bits each, with 6-bit scales and minimums per
    /// 32 values (4.5 bits per weight).
    Q4_K,
    /// ggml's `q5_K`: as `q4_K` with 5 bits per value (5.5 bits per weight).
    Q5_K,
    /// ggml's `q6_K`: blocks of 256 values, 6 bits each, with 8-bit scales per 16 values
    /// (6.5625 bits per weight).
    Q6_K,
}

/// The arithmetic of a layer's projections (its four GEMMs; the attention is always `f32`).
///
/// ```
/// use mha::{Compute, Layer, Projections, WeightFormat, Widths};
/// let w = vec![0.01; 32 * 32];
/// let projections = Projections::new(Widths::self_attention(32, 32, 32), &w, &w, &w, &w)?;
/// let layer = Layer::builder(projections, 2)
///     .weight_format(WeightFormat::Q8_0)
///     .compute(Compute::Int8)
///     .build()?;
/// assert_eq!(layer.compute(), Compute::Int8);
/// # Ok::<(), mha::ShapeError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Compute {
    /// Every product in `f32` (weights of any [`WeightFormat`] widened exactly first); the
    /// default.
    #[default]
    F32,
    /// Weights in [`WeightFormat::Q8_0`] or [`WeightFormat::Q4_0`] times the inputs quantized
    /// to `q8_0` (per 32 values, by ggml's reference quantizer: scale `max|x| / 127` rounded
    /// to binary16, integers `round(x / scale)` half away from zero), as llama.cpp computes
    /// them: per block the exact integer dot product `s`, then `acc += (d_w · d_x) · s` in
    /// `f32`, blocks in order, from the bias or zero. Every instruction set gives the same
    /// bits (AVX512-VNNI and AVX-VNNI sum the bytes with `vpdpbusd`; the others widen them,
    /// exactly, and are then slower than `f32`);
    /// a row's result does not depend on the other rows, the thread count or how the call
    /// is split, so decoding equals the forward pass. The inputs' rounding is an error of
    /// up to half a step of `max|x| / 127` per value, on top of the weights'.
    Int8,
    /// Weights and inputs rounded to bfloat16 (nearest, ties to even; NaN stays NaN; weights
    /// in `f32`, `bf16` or `f16`, those in `bf16` unchanged), each product exact in `f32`, summed
    /// in `f32` from the bias or zero. Without AMX the sum is the `f32` layer's own chain, so
    /// every instruction set gives the bits of [`Compute::F32`] on the rounded operands. On a
    /// CPU with AMX-BF16 whose OS grants the tile state (Linux; the AVX-512 table) the sums run
    /// on `tdpbf16ps`, 32 steps at a time in order, each step summed as that instruction does
    /// (bfloat16 subnormals read as zero, `f32` subnormal sums flushed to zero): other bits
    /// than the other tables, but the same for every thread count and call split, so decoding
    /// still equals the forward pass. The rounding is an error of up to `2^-9` of each operand.
    /// As a layer's attention arithmetic
    /// ([`LayerBuilder::attention_compute`](crate::LayerBuilder::attention_compute)): the
    /// same on the queries (times the scale), keys, probabilities and values, on AMX only.
    Bf16,
}

impl Compute {
    /// Every arithmetic.
    pub const ALL: [Compute; 3] = [Compute::F32, Compute::Int8, Compute::Bf16];

    /// Whether weights stored in `format` can take this arithmetic: [`Compute::F32`] any,
    /// [`Compute::Int8`] `q8_0` or `q4_0`, [`Compute::Bf16`] `f32`, `bf16` or `f16`.
    ///
    /// ```
    /// use mha::{Compute, WeightFormat};
    /// assert!(Compute::Int8.accepts(WeightFormat::Q4_0));
    /// assert!(!Compute::Bf16.accepts(WeightFormat::Q4_0));
    /// ```
    pub fn accepts(self, format: WeightFormat) -> bool {
        use WeightFormat::{Bf16, F16, F32, Q4_0, Q8_0};
        match self {
            Compute::F32 => true,
            Compute::Int8 => matches!(format, Q8_0 | Q4_0),
            Compute::Bf16 => matches!(format, F32 | Bf16 | F16),
        }
    }

    /// Its name: `f32`, `int8` or `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            Compute::F32 => "f32",
            Compute::Int8 => "int8",
            Compute::Bf16 => "bf16",
        }
    }
}

impl WeightFormat {
    /// Every format, widest first.
    pub const ALL: [WeightFormat; 8] = [
        WeightFormat::F32,
        WeightFormat::Bf16,
        WeightFormat::F16,
        WeightFormat::Q8_0,
        WeightFormat::Q4_0,
        WeightFormat::Q4_K,
        WeightFormat::Q5_K,
        WeightFormat::Q6_K,
    ];

    /// Its name, as safetensors' dtypes are spelled in lower case (`f32`, `bf16`, `f16`) or
    /// ggml's block types (`q8_0`, `q4_0`, `q4_K`, `q5_K`, `q6_K`).
    pub fn name(self) -> &'static str {
        match self.storage() {
            Storage::Element(element) => element.name(),
            Storage::Blocks(quant) => quant.name(),
        }
    }

    /// The average bytes per stored weight: 4, 2, or a block's bytes over its values.
    pub fn bytes_per_value(self) -> f64 {
        match self.storage() {
            Storage::Element(element) => element.bytes_per_value(),
            Storage::Blocks(quant) => quant.bytes() as f64 / quant.values() as f64,
        }
    }

    /// Values per block along a matrix's input dimension: 1, or the block's 32 or 256.
    pub fn block_values(self) -> usize {
        match self.storage() {
            Storage::Element(_) => 1,
            Storage::Blocks(quant) => quant.values(),
        }
    }

    /// The bytes of `values` weights (a whole number of blocks) in this format.
    pub(crate) fn bytes(self, values: usize) -> usize {
        match self.storage() {
            Storage::Element(element) => values * element.bytes_per_value() as usize,
            Storage::Blocks(quant) => values / quant.values() * quant.bytes(),
        }
    }

    /// Whether the finite value `x` becomes an infinity when rounded to this format (in a
    /// block format: makes its block's scale one).
    pub(crate) fn overflows(self, x: f32) -> bool {
        match self.storage() {
            Storage::Element(element) => element.can_overflow() && element.overflows(x),
            Storage::Blocks(quant) => quant.overflows(x),
        }
    }

    /// The block format of `quant`.
    pub(crate) fn of_blocks(quant: Quant) -> WeightFormat {
        match quant {
            Quant::Q8_0 => WeightFormat::Q8_0,
            Quant::Q4_0 => WeightFormat::Q4_0,
            Quant::Q4K => WeightFormat::Q4_K,
            Quant::Q5K => WeightFormat::Q5_K,
            Quant::Q6K => WeightFormat::Q6_K,
        }
    }

    /// How its weights are kept.
    pub(crate) fn storage(self) -> Storage {
        match self {
            WeightFormat::F32 => Storage::Element(Element::F32),
            WeightFormat::Bf16 => Storage::Element(Element::Bf16),
            WeightFormat::F16 => Storage::Element(Element::F16),
            WeightFormat::Q8_0 => Storage::Blocks(Quant::Q8_0),
            WeightFormat::Q4_0 => Storage::Blocks(Quant::Q4_0),
            WeightFormat::Q4_K => Storage::Blocks(Quant::Q4K),
            WeightFormat::Q5_K => Storage::Blocks(Quant::Q5K),
            WeightFormat::Q6_K => Storage::Blocks(Quant::Q6K),
        }
    }
}

/// How a [`WeightFormat`] keeps weights: elements in panels, or ggml's blocks along each
/// output's row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Storage {
    /// One [`Element`] per weight.
    Element(Element),
    /// Blocks of a [`Quant`] type.
    Blocks(Quant),
}
