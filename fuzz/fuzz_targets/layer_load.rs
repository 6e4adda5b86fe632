//! `MhaParams::from_safetensors` for every layout and widths 1 to 4, on files of two kinds:
//! any bytes that parse (first byte even), or a layer written for a chosen layout and width
//! with tensors now and then missing, reshaped, of another dtype or joined by tensors the
//! loader must refuse (first byte odd). Every load is compared with `expected`, the layouts'
//! rules written out again here: the same Ok/Err, and on Ok the same values.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mha::safetensors::{serialize_raw, Dtype, Layout, SafeTensors};
use mha::MhaParams;
use mha_fuzz::{expected_f32, join, same_values, Input, LAYOUTS};

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    if input.byte() & 1 == 0 {
        let file = input.bytes(usize::MAX);
        let Ok(st) = SafeTensors::parse(file) else {
            return;
        };
        for layout in LAYOUTS {
            let mut prefixes = layout.prefixes_in(&st);
            prefixes.truncate(3);
            prefixes.push(String::new());
            for prefix in &prefixes {
                load_every_width(&st, prefix, layout);
            }
        }
    } else {
        let layout = LAYOUTS[input.below(LAYOUTS.len())];
        let width = 1 + input.below(4);
        let prefix = input.name(3);
        let file = layer_file(&mut input, layout, &prefix, width);
        let st = SafeTensors::parse(&file).expect("the writer's output parses");
        load_every_width(&st, &prefix, layout);
    }
});

fn load_every_width(st: &SafeTensors<'_>, prefix: &str, layout: Layout) {
    check::<1>(st, prefix, layout);
    check::<2>(st, prefix, layout);
    check::<3>(st, prefix, layout);
    check::<4>(st, prefix, layout);
}

/// The four weights and the four optional biases of a layer, row-major.
type Layer = ([Vec<f32>; 4], [Option<Vec<f32>>; 4]);

fn check<const D: usize>(st: &SafeTensors<'_>, prefix: &str, layout: Layout) {
    let got = MhaParams::<D>::from_safetensors(st, prefix, layout, 1);
    match (
        got,
        expected(st, prefix.strip_suffix('.').unwrap_or(prefix), layout, D),
    ) {
        (Ok((p, b)), Some((weights, biases))) => {
            let got = [&p.wq, &p.wk, &p.wv, &p.wo].map(|w| w.as_slice().to_vec());
            for (g, w) in got.iter().zip(&weights) {
                assert!(same_values(g, w), "{layout} D {D}: weights differ");
            }
            let got = [&b.bq, &b.bk, &b.bv, &b.bo].map(|b| b.as_ref().map(|b| b.as_slice()));
            for (g, w) in got.iter().zip(&biases) {
                let same = match (g, w) {
                    (Some(g), Some(w)) => same_values(g, w),
                    (None, None) => true,
                    _ => false,
                };
                assert!(same, "{layout} D {D}: biases differ");
            }
        }
        (Err(e), None) => assert!(!e.to_string().is_empty()),
        (got, want) => panic!(
            "{layout} D {D} prefix {prefix:?}: loaded {:?}, expected {}",
            got.map(|_| ()),
            if want.is_some() { "Ok" } else { "Err" }
        ),
    }
}

/// The values of tensor `{prefix}.{suffix}` when it has `shape` and converts to `f32`.
fn tensor(st: &SafeTensors<'_>, prefix: &str, suffix: &str, shape: &[usize]) -> Option<Vec<f32>> {
    let t = st.get(&join(prefix, suffix))?;
    if t.shape() != shape {
        return None;
    }
    expected_f32(t.dtype(), t.data())
}

/// `w` is `(rows, D)` row-major: rows `first .. first + D`, transposed, as a `(D, D)` matrix.
fn rows_transposed(w: &[f32], first: usize, d: usize) -> Vec<f32> {
    let mut out = vec![0.0; d * d];
    for (j, row) in w.chunks(d).skip(first).take(d).enumerate() {
        for (i, &value) in row.iter().enumerate() {
            out[i * d + j] = value;
        }
    }
    out
}

/// `w` is `(D, width)` row-major: columns `first .. first + D` as a `(D, D)` matrix.
fn columns(w: &[f32], width: usize, first: usize, d: usize) -> Vec<f32> {
    w.chunks(width)
        .flat_map(|row| row[first..first + d].iter().copied())
        .collect()
}

/// What loading a layer of width `d` at `prefix` must give, or `None` when it must fail.
fn expected(st: &SafeTensors<'_>, prefix: &str, layout: Layout, d: usize) -> Option<Layer> {
    let t = |suffix: &str, shape: &[usize]| tensor(st, prefix, suffix, shape);
    let has = |suffix: &str| st.get(&join(prefix, suffix)).is_some();
    let thirds = |b: &[f32]| [0, 1, 2].map(|i| Some(b[i * d..][..d].to_vec()));
    // Typed parameters hold no QK-norm and no sinks: a layer with them is refused.
    if ["q_norm.weight", "k_norm.weight", "sinks"].iter().any(|s| has(s)) {
        return None;
    }
    match layout {
        Layout::PytorchMha => {
            if has("bias_k") || has("bias_v") || (!has("in_proj_weight") && has("q_proj_weight")) {
                return None;
            }
            let w = t("in_proj_weight", &[3 * d, d])?;
            let wo = t("out_proj.weight", &[d, d])?;
            let [wq, wk, wv] = [0, 1, 2].map(|i| rows_transposed(&w, i * d, d));
            let weights = [wq, wk, wv, rows_transposed(&wo, 0, d)];
            let biases = match (has("in_proj_bias"), has("out_proj.bias")) {
                (false, false) => [None, None, None, None],
                (true, true) => {
                    let [bq, bk, bv] = thirds(&t("in_proj_bias", &[3 * d])?);
                    [bq, bk, bv, Some(t("out_proj.bias", &[d])?)]
                }
                _ => return None,
            };
            Some((weights, biases))
        }
        Layout::Bert | Layout::DistilBert => {
            let names = if layout == Layout::Bert {
                ["self.query", "self.key", "self.value", "output.dense"]
            } else {
                ["q_lin", "k_lin", "v_lin", "out_lin"]
            };
            let mut weights: [Vec<f32>; 4] = Default::default();
            let mut biases: [Option<Vec<f32>>; 4] = Default::default();
            for (i, name) in names.iter().enumerate() {
                weights[i] = rows_transposed(&t(&format!("{name}.weight"), &[d, d])?, 0, d);
                biases[i] = Some(t(&format!("{name}.bias"), &[d])?);
            }
            Some((weights, biases))
        }
        _ => {
            let w = t("c_attn.weight", &[d, 3 * d])?;
            let b = t("c_attn.bias", &[3 * d])?;
            let wo = t("c_proj.weight", &[d, d])?;
            let bo = t("c_proj.bias", &[d])?;
            let [wq, wk, wv] = [0, 1, 2].map(|i| columns(&w, 3 * d, i * d, d));
            let [bq, bk, bv] = thirds(&b);
            Some(([wq, wk, wv, wo], [bq, bk, bv, Some(bo)]))
        }
    }
}

/// The shape a layer of width `d` stores under a tensor-name suffix.
fn shape_of(suffix: &str, d: usize) -> Vec<usize> {
    match suffix {
        "in_proj_weight" => vec![3 * d, d],
        "c_attn.weight" => vec![d, 3 * d],
        "in_proj_bias" | "c_attn.bias" => vec![3 * d],
        s if s.ends_with("weight") => vec![d, d],
        _ => vec![d],
    }
}

/// A file holding a `layout` layer of width `d` at `prefix`, each tensor now and then left
/// out, reshaped or stored as another dtype, and for PyTorch now and then with a tensor the
/// loader must refuse.
fn layer_file(input: &mut Input<'_>, layout: Layout, prefix: &str, d: usize) -> Vec<u8> {
    let prefix = prefix.strip_suffix('.').unwrap_or(prefix);
    let mut suffixes = layout.tensor_names("");
    if layout == Layout::PytorchMha && input.below(8) == 0 {
        suffixes.push(["bias_k", "bias_v", "q_proj_weight"][input.below(3)].to_owned());
    }
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for suffix in suffixes {
        if input.below(16) == 0 {
            continue;
        }
        let mut shape = shape_of(&suffix, d);
        match input.below(16) {
            0 => shape.push(1),
            1 => shape[0] = input.below(5),
            2 => shape.reverse(),
            _ => {}
        }
        let dtype = match input.below(16) {
            0 | 1 => Dtype::F16,
            2 | 3 => Dtype::BF16,
            4 => [Dtype::I8, Dtype::F64, Dtype::U16][input.below(3)],
            _ => Dtype::F32,
        };
        let len = shape.iter().product::<usize>() * dtype.bits() / 8;
        let mut bytes = input.bytes(len).to_vec();
        bytes.resize(len, 0);
        tensors.push((join(prefix, &suffix), dtype, shape, bytes));
    }
    let raw: Vec<_> = tensors
        .iter()
        .map(|(n, dtype, s, b)| (n.as_str(), *dtype, s.as_slice(), b.as_slice()))
        .collect();
    serialize_raw(&raw, &[]).expect("distinct names, whole bytes")
}
