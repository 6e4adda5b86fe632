//! Helpers shared by the fuzz targets: a reader that turns fuzz bytes into choices, and the
//! checks each target applies to what the crate returns. Every check compares against values
//! computed here from the raw bytes, independently of the crate's own conversions.

use mha::safetensors::{Dtype, Layout, SafeTensors, SafeTensorsError};

/// Reads choices from fuzz bytes; once they run out every choice is 0.
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    /// A reader over `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Input { data }
    }

    /// The next byte, or 0.
    pub fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        usize::from(self.byte()) % n
    }

    /// Up to `n` of the next bytes.
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.data.split_at(n.min(self.data.len()));
        self.data = rest;
        head
    }

    /// A short string over an alphabet of JSON's troublemakers: quotes, backslashes, control
    /// characters, the separators of layer names, multi-byte characters.
    pub fn name(&mut self, max_len: usize) -> String {
        const ALPHABET: [char; 12] = [
            'a', 'b', '.', '0', '"', '\\', '\n', '\u{1}', '\u{7f}', 'é', '\u{2028}', '😀',
        ];
        let len = self.below(max_len + 1);
        (0..len)
            .map(|_| ALPHABET[self.below(ALPHABET.len())])
            .collect()
    }
}

/// The data region of a file that parsed: the bytes after the length and the header.
pub fn data_region(file: &[u8]) -> &[u8] {
    let header_len = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    &file[8 + header_len..]
}

/// `f16` bits to `f32`, by arithmetic in `f64` rather than by moving bit fields.
pub fn f16_reference(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let mant = f64::from(h & 0x3ff);
    match exp {
        0 => (sign * mant * 2f64.powi(-24)) as f32,
        0x1f if mant == 0.0 => (sign * f64::INFINITY) as f32,
        0x1f => f32::NAN,
        _ => (sign * (1.0 + mant / 1024.0) * 2f64.powi(exp - 15)) as f32,
    }
}

/// `bf16` bits to `f32`: the upper half of the `f32` bits.
pub fn bf16_reference(b: u16) -> f32 {
    f32::from_be_bytes([(b >> 8) as u8, b as u8, 0, 0])
}

/// The values of a tensor's raw bytes as `f32`, by the references above; `None` for a dtype
/// that does not convert.
pub fn expected_f32(dtype: Dtype, data: &[u8]) -> Option<Vec<f32>> {
    let halves = |f: fn(u16) -> f32| {
        data.chunks(2)
            .map(|b| f(u16::from(b[0]) | u16::from(b[1]) << 8))
            .collect()
    };
    match dtype {
        Dtype::F32 => Some(
            data.chunks(4)
                .map(|b| f32::from_bits(u32::from_le_bytes(b.try_into().unwrap())))
                .collect(),
        ),
        Dtype::F16 => Some(halves(f16_reference)),
        Dtype::BF16 => Some(halves(bf16_reference)),
        _ => None,
    }
}

/// Equal values, NaN equal to any NaN (payloads are not promised by the references).
pub fn same_values(got: &[f32], want: &[f32]) -> bool {
    got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(g, w)| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()))
}

/// `{prefix}.{suffix}`, or `suffix` for an empty prefix.
pub fn join(prefix: &str, suffix: &str) -> String {
    if prefix.is_empty() {
        suffix.to_owned()
    } else {
        format!("{prefix}.{suffix}")
    }
}

/// Checks every accessor of a parsed file against the raw bytes of `file`.
pub fn check_accessors(st: &SafeTensors<'_>, file: &[u8]) {
    let region = data_region(file);
    assert_eq!(st.len(), st.tensors().len());
    assert_eq!(st.is_empty(), st.len() == 0);
    let names: Vec<&str> = st.names().collect();
    assert_eq!(names.len(), st.len());
    assert!(
        names.windows(2).all(|w| w[0] < w[1]),
        "names sorted, unique"
    );
    // In data order the tensors tile the region.
    let mut covered = 0;
    for t in st.tensors() {
        let (begin, end) = t.data_offsets();
        assert_eq!(begin, covered);
        assert_eq!(t.data(), &region[begin..end]);
        covered = end;
        check_tensor(st, t);
    }
    assert_eq!(covered, region.len());
    let missing = "\u{0}not a tensor";
    assert!(st.get(missing).is_none());
    assert!(matches!(
        st.tensor(missing),
        Err(SafeTensorsError::NotFound { .. })
    ));
    for layout in LAYOUTS {
        for prefix in layout.prefixes_in(st) {
            let first = layout.tensor_names(&prefix).swap_remove(0);
            assert!(st.get(&first).is_some(), "{layout}: {first}");
        }
    }
    let _ = format!("{st:?}");
}

/// Every layout.
pub const LAYOUTS: [Layout; 4] = [
    Layout::PytorchMha,
    Layout::Bert,
    Layout::DistilBert,
    Layout::Gpt2,
];

/// Checks the accessors of one tensor.
fn check_tensor(st: &SafeTensors<'_>, t: mha::safetensors::TensorView<'_>) {
    assert_eq!(st.get(t.name()), Some(t));
    assert_eq!(st.tensor(t.name()).ok(), Some(t));
    let count = t.shape().iter().product::<usize>();
    assert_eq!(t.element_count(), count);
    assert_eq!(
        count as u128 * t.dtype().bits() as u128,
        t.data().len() as u128 * 8
    );
    let want = expected_f32(t.dtype(), t.data());
    match (t.to_f32(), &want) {
        (Ok(got), Some(want)) => assert!(same_values(&got, want), "{}", t.name()),
        (Err(SafeTensorsError::NotConvertible { .. }), None) => {}
        (got, _) => panic!("{}: to_f32 gave {got:?}", t.name()),
    }
    match st.tensor_f32(t.name()) {
        Ok((shape, values)) => {
            assert_eq!(shape, t.shape());
            assert!(same_values(&values, want.as_deref().unwrap()));
        }
        Err(e) => assert!(want.is_none(), "{e}"),
    }
    if let [len] = *t.shape() {
        assert_eq!(st.vector(t.name(), len).is_ok(), want.is_some());
        let other = st.vector(t.name(), len.wrapping_add(1));
        assert!(matches!(other, Err(SafeTensorsError::ShapeMismatch { .. })));
    }
    let is_2x3 = t.shape() == [2, 3];
    match st.matrix::<2, 3>(t.name()) {
        Ok(m) => {
            assert!(is_2x3 && same_values(m.as_slice(), want.as_deref().unwrap()));
            let mt = st.matrix_transposed::<3, 2>(t.name()).unwrap();
            assert!(same_values(mt.as_slice(), m.transpose().as_slice()));
        }
        Err(e) => assert!(!is_2x3 || want.is_none(), "{e}"),
    }
    let _ = format!("{t:?}");
}
