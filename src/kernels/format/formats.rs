//! The public element formats: [`KvFormat`] for a key/value store, [`WeightFormat`] for the
//! packed projection weights, each a choice among the [`Element`] formats.

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

/// How a layer keeps its projection weights (`Wq`, `Wk`, `Wv`, `Wo`) in its packed panels;
/// set with [`LayerBuilder::weight_format`](crate::LayerBuilder::weight_format). A 16-bit
/// format rounds each `f32` weight once, to nearest, ties to even, when the layer is built,
/// and the kernels widen the stored values exactly, so a layer built from `f32` weights in
/// [`WeightFormat::Bf16`] gives the bits of one built in [`WeightFormat::F32`] from the same
/// weights rounded to bfloat16 first, with half the bytes. A checkpoint stored in bf16 or f16
/// loads in its own format ([`LayerWeights::format`](crate::LayerWeights::format)), which
/// loses nothing. Biases stay `f32`.
///
/// ```
/// use mha::WeightFormat;
/// assert_eq!(WeightFormat::default(), WeightFormat::F32);
/// assert_eq!(WeightFormat::Bf16.bytes_per_value(), 2);
/// assert_eq!(WeightFormat::F16.name(), "f16");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// `f32` (the default).
    #[default]
    F32,
    /// bfloat16: 8 exponent bits, 8 significant bits.
    Bf16,
    /// IEEE binary16 (half): 5 exponent bits, 11 significant bits; finite weights must be
    /// below 65520 in magnitude (the layer's builder says which is not).
    F16,
}

impl WeightFormat {
    /// Every format, widest first.
    pub const ALL: [WeightFormat; 3] = [WeightFormat::F32, WeightFormat::Bf16, WeightFormat::F16];

    /// Its name, as safetensors' dtypes are spelled in lower case: `f32`, `bf16`, `f16`.
    pub fn name(self) -> &'static str {
        self.element().name()
    }

    /// Bytes per stored weight: 4 or 2.
    pub fn bytes_per_value(self) -> usize {
        self.element().bytes_per_value() as usize
    }

    /// The first of `values` (with its index) that is finite but becomes an infinity when
    /// rounded to this format, if any.
    pub(crate) fn first_overflow(self, values: &[f32]) -> Option<(usize, f32)> {
        let element = self.element();
        if !element.can_overflow() {
            return None;
        }
        values
            .iter()
            .position(|&x| x.is_finite() && element.overflows(x))
            .map(|i| (i, values[i]))
    }

    /// Its element format.
    pub(crate) fn element(self) -> Element {
        match self {
            WeightFormat::F32 => Element::F32,
            WeightFormat::Bf16 => Element::Bf16,
            WeightFormat::F16 => Element::F16,
        }
    }

    /// The format whose element format is `element`, if weights may be kept in it.
    pub(crate) fn of(element: Element) -> Option<WeightFormat> {
        WeightFormat::ALL
            .into_iter()
            .find(|f| f.element() == element)
    }
}
