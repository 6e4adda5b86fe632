//! Checkpoint layouts: fixture files in the PyTorch, BERT, DistilBERT and GPT-2 layouts, built
//! here with the crate's writer, loaded with `MhaParams::from_safetensors`, run, and compared
//! with an f64 reference computed straight from the stored arrays with each framework's own
//! formula; then every way a load can fail.

mod common;

use common::{
    assert_close, attend_heads, default_scale, f32_tensor, file, values, HeadDims, Rng, Stored,
};
use mha::safetensors::{Dtype, Layout, SafeTensors};
use mha::LoadError;
use mha::{Masking, Mha, MhaBiases, MhaParams, Tensor};

const B: usize = 2;
const T: usize = 5;

// ---------------------------------------------------------------------------------------------
// The f64 reference, written from the frameworks' formulas

/// `rows` rows of `n_in` features through a linear map given element-wise:
/// `out[r][o] = Σ_i a[r][i] · w(i, o) + bias(o)`.
fn project(
    a: &[f64],
    rows: usize,
    n_in: usize,
    n_out: usize,
    w: impl Fn(usize, usize) -> f32,
    bias: impl Fn(usize) -> f32,
) -> Vec<f64> {
    let mut out = vec![0.0; rows * n_out];
    for r in 0..rows {
        for o in 0..n_out {
            let dot: f64 = (0..n_in).map(|i| a[r * n_in + i] * w(i, o) as f64).sum();
            out[r * n_out + o] = dot + bias(o) as f64;
        }
    }
    out
}

/// Multi-head scaled dot-product attention of `(B·T, dm)` rows `q`, `k`, `v` with `h` heads of
/// consecutive features (the tests' one oracle, [`attend_heads`]); returns the merged
/// `(B·T, dm)` rows.
fn attend(q: &[f64], k: &[f64], v: &[f64], dm: usize, h: usize, causal: bool) -> Vec<f64> {
    let d = dm / h;
    let dims = HeadDims {
        b: B,
        t: T,
        s: T,
        h,
        n_kv: h,
        d,
    };
    let visible = |_: usize, i: usize, j: usize| (!causal || j <= i).then_some(0.0);
    attend_heads(q, k, v, dims, default_scale(d), visible).0
}

/// `torch.nn.MultiheadAttention`: `q = x · in_proj_weight[0:D]ᵀ + in_proj_bias[0:D]`, k and v
/// from the next row blocks, `y = merged · out_proj.weightᵀ + out_proj.bias`.
fn pytorch_reference<const D: usize>(
    x: &[f32],
    fx: &[Stored],
    p: &str,
    h: usize,
    causal: bool,
) -> Vec<f64> {
    let x: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let w = values(fx, &format!("{p}.in_proj_weight"));
    let has_bias = fx.iter().any(|t| t.name == format!("{p}.in_proj_bias"));
    let zeros = vec![0.0; 3 * D];
    let b = if has_bias {
        values(fx, &format!("{p}.in_proj_bias"))
    } else {
        &zeros
    };
    let part = |block: usize| {
        project(
            &x,
            B * T,
            D,
            D,
            |i, o| w[(block * D + o) * D + i],
            |o| b[block * D + o],
        )
    };
    let merged = attend(&part(0), &part(1), &part(2), D, h, causal);
    let wo = values(fx, &format!("{p}.out_proj.weight"));
    let bo = if has_bias {
        values(fx, &format!("{p}.out_proj.bias"))
    } else {
        &zeros
    };
    project(&merged, B * T, D, D, |i, o| wo[o * D + i], |o| bo[o])
}

/// Hugging Face `nn.Linear` layers (BERT, DistilBERT): `y = x · weightᵀ + bias` for each of
/// `names` = [query, key, value, output], bidirectional attention in between.
fn linear_reference<const D: usize>(
    x: &[f32],
    fx: &[Stored],
    p: &str,
    names: [&str; 4],
    h: usize,
) -> Vec<f64> {
    let linear = |a: &[f64], name: &str| {
        let w = values(fx, &format!("{p}.{name}.weight"));
        let b = values(fx, &format!("{p}.{name}.bias"));
        project(a, B * T, D, D, |i, o| w[o * D + i], |o| b[o])
    };
    let x: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let merged = attend(
        &linear(&x, names[0]),
        &linear(&x, names[1]),
        &linear(&x, names[2]),
        D,
        h,
        false,
    );
    linear(&merged, names[3])
}

/// GPT-2's `Conv1D`: `[q | k | v] = x · c_attn.weight + c_attn.bias` (weight `(D, 3D)`),
/// causal attention, `y = merged · c_proj.weight + c_proj.bias`.
fn gpt2_reference<const D: usize>(x: &[f32], fx: &[Stored], p: &str, h: usize) -> Vec<f64> {
    let x: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let w = values(fx, &format!("{p}.c_attn.weight"));
    let b = values(fx, &format!("{p}.c_attn.bias"));
    let qkv = project(&x, B * T, D, 3 * D, |i, o| w[i * 3 * D + o], |o| b[o]);
    let split = |part: usize| -> Vec<f64> {
        qkv.chunks_exact(3 * D)
            .flat_map(|row| row[part * D..][..D].to_vec())
            .collect()
    };
    let merged = attend(&split(0), &split(1), &split(2), D, h, true);
    let wo = values(fx, &format!("{p}.c_proj.weight"));
    let bo = values(fx, &format!("{p}.c_proj.bias"));
    project(&merged, B * T, D, D, |i, o| wo[i * D + o], |o| bo[o])
}

// ---------------------------------------------------------------------------------------------
// Fixtures

/// A `torch.nn.MultiheadAttention(D, H)` state dict under `p`, next to unrelated tensors.
fn pytorch_fixture<const D: usize>(rng: &mut Rng, p: &str, bias: bool) -> Vec<Stored> {
    let mut fx = vec![
        f32_tensor(
            "layers.0.linear1.weight",
            &[2 * D, D],
            rng.vec(2 * D * D, 0.5),
        ),
        f32_tensor(
            &format!("{p}.in_proj_weight"),
            &[3 * D, D],
            rng.vec(3 * D * D, 0.6),
        ),
        f32_tensor(
            &format!("{p}.out_proj.weight"),
            &[D, D],
            rng.vec(D * D, 0.6),
        ),
    ];
    if bias {
        fx.push(f32_tensor(
            &format!("{p}.in_proj_bias"),
            &[3 * D],
            rng.vec(3 * D, 0.3),
        ));
        fx.push(f32_tensor(
            &format!("{p}.out_proj.bias"),
            &[D],
            rng.vec(D, 0.3),
        ));
    }
    fx
}

/// Two BERT layers (attention, LayerNorm, intermediate) plus I64 position ids.
fn bert_fixture<const D: usize>(rng: &mut Rng) -> Vec<Stored> {
    let mut fx = vec![Stored {
        name: "embeddings.position_ids".to_string(),
        dtype: Dtype::I64,
        shape: vec![1, 8],
        values: (0..8).map(|i| i as f32).collect(),
    }];
    for layer in 0..2 {
        let p = format!("encoder.layer.{layer}.attention");
        for name in ["self.query", "self.key", "self.value", "output.dense"] {
            fx.push(f32_tensor(
                &format!("{p}.{name}.weight"),
                &[D, D],
                rng.vec(D * D, 0.6),
            ));
            fx.push(f32_tensor(
                &format!("{p}.{name}.bias"),
                &[D],
                rng.vec(D, 0.3),
            ));
        }
        fx.push(f32_tensor(
            &format!("{p}.output.LayerNorm.weight"),
            &[D],
            vec![1.0; D],
        ));
        fx.push(f32_tensor(
            &format!("{p}.output.LayerNorm.bias"),
            &[D],
            vec![0.0; D],
        ));
        fx.push(f32_tensor(
            &format!("encoder.layer.{layer}.intermediate.dense.weight"),
            &[4 * D, D],
            rng.vec(4 * D * D, 0.1),
        ));
    }
    fx
}

/// One GPT-2 block's attention, with the causal-mask buffer `h.0.attn.bias` real checkpoints
/// carry, and layer norms.
fn gpt2_fixture<const D: usize>(rng: &mut Rng) -> Vec<Stored> {
    let tril: Vec<f32> = (0..T * T).map(|n| (n % T <= n / T) as u8 as f32).collect();
    vec![
        f32_tensor("wte.weight", &[10, D], rng.vec(10 * D, 0.1)),
        f32_tensor("h.0.ln_1.weight", &[D], vec![1.0; D]),
        f32_tensor("h.0.attn.bias", &[1, 1, T, T], tril),
        f32_tensor(
            "h.0.attn.c_attn.weight",
            &[D, 3 * D],
            rng.vec(3 * D * D, 0.6),
        ),
        f32_tensor("h.0.attn.c_attn.bias", &[3 * D], rng.vec(3 * D, 0.3)),
        f32_tensor("h.0.attn.c_proj.weight", &[D, D], rng.vec(D * D, 0.6)),
        f32_tensor("h.0.attn.c_proj.bias", &[D], rng.vec(D, 0.3)),
    ]
}

/// A DistilBERT layer's attention.
fn distilbert_fixture<const D: usize>(rng: &mut Rng) -> Vec<Stored> {
    let p = "transformer.layer.0.attention";
    let mut fx = Vec::new();
    for name in ["q_lin", "k_lin", "v_lin", "out_lin"] {
        fx.push(f32_tensor(
            &format!("{p}.{name}.weight"),
            &[D, D],
            rng.vec(D * D, 0.6),
        ));
        fx.push(f32_tensor(
            &format!("{p}.{name}.bias"),
            &[D],
            rng.vec(D, 0.3),
        ));
    }
    fx
}

/// Loads the layer at `p` and runs it on `x`.
fn run<const D: usize>(
    bytes: &[u8],
    p: &str,
    layout: Layout,
    h: usize,
    masking: Masking,
    x: &Tensor<B, T, D>,
) -> Vec<f32> {
    let st = SafeTensors::parse(bytes).expect("fixture parses");
    let (params, biases) = MhaParams::<D>::from_safetensors(&st, p, layout, h)
        .unwrap_or_else(|e| panic!("loading {layout} at {p:?}: {e}"));
    let mut layer = Mha::builder(&params, h)
        .masking(masking)
        .biases(biases)
        .threads(1)
        .build()
        .expect("valid head count");
    layer.forward(x).unwrap().into_vec()
}

fn input<const D: usize>(rng: &mut Rng) -> Tensor<B, T, D> {
    Tensor::from_vec(rng.vec(B * T * D, 1.0)).unwrap()
}

fn load_err<const D: usize>(bytes: &[u8], p: &str, layout: Layout) -> LoadError {
    let st = SafeTensors::parse(bytes).expect("fixture parses");
    match MhaParams::<D>::from_safetensors(&st, p, layout, 1) {
        Ok(_) => panic!("loading {layout} at {p:?} succeeded"),
        Err(e) => e,
    }
}

const TOL: f64 = 1e-4;

// ---------------------------------------------------------------------------------------------
// Each layout against its framework's formula

#[test]
fn pytorch_layout_matches_reference() {
    const D: usize = 6;
    let p = "layers.0.self_attn";
    let mut rng = Rng::new(11);
    let fx = pytorch_fixture::<D>(&mut rng, p, true);
    let bytes = file(&fx);
    let x = input::<D>(&mut rng);
    for h in [1, 2, 3, 6] {
        for (masking, causal) in [(Masking::Causal, true), (Masking::Bidirectional, false)] {
            let got = run::<D>(&bytes, p, Layout::PytorchMha, h, masking, &x);
            let want = pytorch_reference::<D>(x.as_slice(), &fx, p, h, causal);
            assert_close(&got, &want, TOL, TOL, &format!("PyTorch H={h} {masking:?}"));
        }
    }
}

#[test]
fn pytorch_layout_loads_the_transposes() {
    const D: usize = 3;
    let mut rng = Rng::new(12);
    let fx = pytorch_fixture::<D>(&mut rng, "attn", true);
    let bytes = file(&fx);
    let st = SafeTensors::parse(&bytes).unwrap();
    let (params, biases) =
        MhaParams::<D>::from_safetensors(&st, "attn", Layout::PytorchMha, 1).unwrap();
    let w = values(&fx, "attn.in_proj_weight");
    let wo = values(&fx, "attn.out_proj.weight");
    let b = values(&fx, "attn.in_proj_bias");
    for i in 0..D {
        for o in 0..D {
            assert_eq!(params.wq[(i, o)], w[o * D + i]);
            assert_eq!(params.wk[(i, o)], w[(D + o) * D + i]);
            assert_eq!(params.wv[(i, o)], w[(2 * D + o) * D + i]);
            assert_eq!(params.wo[(i, o)], wo[o * D + i]);
        }
    }
    assert_eq!(biases.bk.unwrap().as_slice(), &b[D..2 * D]);
    assert_eq!(biases.bv.unwrap().as_slice(), &b[2 * D..]);
    assert_eq!(
        biases.bo.unwrap().as_slice(),
        values(&fx, "attn.out_proj.bias")
    );
}

#[test]
fn pytorch_layout_without_biases() {
    const D: usize = 6;
    let mut rng = Rng::new(13);
    // bias=False: neither bias is saved; an empty prefix is the module on its own.
    let fx: Vec<Stored> = pytorch_fixture::<D>(&mut rng, "m", false)
        .into_iter()
        .map(|mut t| {
            t.name = t.name.trim_start_matches("m.").to_string();
            t
        })
        .collect();
    let bytes = file(&fx);
    let st = SafeTensors::parse(&bytes).unwrap();
    let (_, biases) = MhaParams::<D>::from_safetensors(&st, "", Layout::PytorchMha, 1).unwrap();
    assert_eq!(biases, MhaBiases::default());
    let x = input::<D>(&mut rng);
    let got = run::<D>(&bytes, "", Layout::PytorchMha, 3, Masking::Causal, &x);
    let renamed: Vec<Stored> = fx
        .iter()
        .map(|t| f32_tensor(&format!("m.{}", t.name), &t.shape, t.values.clone()))
        .collect();
    let want = pytorch_reference::<D>(x.as_slice(), &renamed, "m", 3, true);
    assert_close(&got, &want, TOL, TOL, "PyTorch bias=False");
}

#[test]
fn bert_layout_matches_reference() {
    const D: usize = 6;
    let mut rng = Rng::new(21);
    let fx = bert_fixture::<D>(&mut rng);
    let bytes = file(&fx);
    let x = input::<D>(&mut rng);
    let names = ["self.query", "self.key", "self.value", "output.dense"];
    for layer in 0..2 {
        let p = format!("encoder.layer.{layer}.attention");
        for h in [2, 3] {
            let got = run::<D>(&bytes, &p, Layout::Bert, h, Masking::Bidirectional, &x);
            let want = linear_reference::<D>(x.as_slice(), &fx, &p, names, h);
            assert_close(&got, &want, TOL, TOL, &format!("BERT {p} H={h}"));
        }
    }
    // A trailing dot on the prefix is ignored.
    let st = SafeTensors::parse(&bytes).unwrap();
    let a = MhaParams::<D>::from_safetensors(&st, "encoder.layer.1.attention.", Layout::Bert, 1);
    let b = MhaParams::<D>::from_safetensors(&st, "encoder.layer.1.attention", Layout::Bert, 1);
    assert_eq!(a.unwrap(), b.unwrap());
}

#[test]
fn distilbert_layout_matches_reference() {
    const D: usize = 9;
    let mut rng = Rng::new(31);
    let fx = distilbert_fixture::<D>(&mut rng);
    let bytes = file(&fx);
    let x = input::<D>(&mut rng);
    let p = "transformer.layer.0.attention";
    let names = ["q_lin", "k_lin", "v_lin", "out_lin"];
    let got = run::<D>(&bytes, p, Layout::DistilBert, 3, Masking::Bidirectional, &x);
    let want = linear_reference::<D>(x.as_slice(), &fx, p, names, 3);
    assert_close(&got, &want, TOL, TOL, "DistilBERT H=3");
}

#[test]
fn gpt2_layout_matches_reference() {
    const D: usize = 6;
    let mut rng = Rng::new(41);
    let fx = gpt2_fixture::<D>(&mut rng);
    let bytes = file(&fx);
    let x = input::<D>(&mut rng);
    for h in [2, 3] {
        let got = run::<D>(&bytes, "h.0.attn", Layout::Gpt2, h, Masking::Causal, &x);
        let want = gpt2_reference::<D>(x.as_slice(), &fx, "h.0.attn", h);
        assert_close(&got, &want, TOL, TOL, &format!("GPT-2 H={h}"));
    }
    // c_attn is already x @ W: its columns are wq, wk, wv as stored.
    let st = SafeTensors::parse(&bytes).unwrap();
    let (params, _) = MhaParams::<D>::from_safetensors(&st, "h.0.attn", Layout::Gpt2, 1).unwrap();
    let w = values(&fx, "h.0.attn.c_attn.weight");
    assert_eq!(params.wk[(2, 1)], w[2 * 3 * D + D + 1]);
    assert_eq!(params.wo.as_slice(), values(&fx, "h.0.attn.c_proj.weight"));
}

/// Values `k / 64` are exact in f32, f16 and bf16, so the reference sees the stored values.
fn halves_fixture<const D: usize>(rng: &mut Rng, dtype: Dtype) -> Vec<Stored> {
    bert_fixture::<D>(rng)
        .into_iter()
        .map(|mut t| {
            if t.dtype == Dtype::F32 {
                t.values = t
                    .values
                    .iter()
                    .map(|v| (v * 64.0).round().clamp(-64.0, 64.0) / 64.0)
                    .collect();
                t.dtype = dtype;
            }
            t
        })
        .collect()
}

#[test]
fn f16_and_bf16_checkpoints_load() {
    const D: usize = 6;
    let names = ["self.query", "self.key", "self.value", "output.dense"];
    for dtype in [Dtype::F16, Dtype::BF16] {
        let mut rng = Rng::new(51);
        let fx = halves_fixture::<D>(&mut rng, dtype);
        let bytes = file(&fx);
        let st = SafeTensors::parse(&bytes).unwrap();
        assert_eq!(
            st.tensor("encoder.layer.0.attention.self.key.weight")
                .unwrap()
                .dtype(),
            dtype
        );
        let x = input::<D>(&mut rng);
        let p = "encoder.layer.0.attention";
        let got = run::<D>(&bytes, p, Layout::Bert, 2, Masking::Bidirectional, &x);
        let want = linear_reference::<D>(x.as_slice(), &fx, p, names, 2);
        assert_close(&got, &want, TOL, TOL, &format!("BERT {dtype}"));
    }
}

// ---------------------------------------------------------------------------------------------
// Errors

#[test]
fn missing_tensor_names_it() {
    const D: usize = 6;
    let fx: Vec<Stored> = gpt2_fixture::<D>(&mut Rng::new(61))
        .into_iter()
        .filter(|t| t.name != "h.0.attn.c_proj.bias")
        .collect();
    let err = load_err::<D>(&file(&fx), "h.0.attn", Layout::Gpt2);
    assert!(
        matches!(&err, LoadError::MissingTensor { tensor, layers, .. }
            if tensor == "h.0.attn.c_proj.bias" && layers == &["h.0.attn"]),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(message.contains(r#""h.0.attn.c_proj.bias""#), "{message}");
    assert!(message.ends_with(r#"in it: "h.0.attn""#), "{message}");
}

#[test]
fn wrong_prefix_lists_the_layers_there_are() {
    const D: usize = 6;
    let bytes = file(&bert_fixture::<D>(&mut Rng::new(62)));
    let err = load_err::<D>(&bytes, "bert.encoder.layer.0.attention", Layout::Bert);
    let message = err.to_string();
    assert!(
        message.contains(r#""bert.encoder.layer.0.attention.self.query.weight""#)
            && message.ends_with(r#": "encoder.layer.0.attention", "encoder.layer.1.attention""#),
        "{message}"
    );
    // The prefix of the whole layer rather than of its attention.
    let err = load_err::<D>(&bytes, "encoder.layer.0", Layout::Bert);
    assert!(
        matches!(err, LoadError::MissingTensor { ref tensor, .. } if tensor == "encoder.layer.0.self.query.weight")
    );
}

#[test]
fn wrong_layout_says_the_file_has_none() {
    const D: usize = 6;
    let bytes = file(&bert_fixture::<D>(&mut Rng::new(63)));
    let err = load_err::<D>(&bytes, "encoder.layer.0.attention", Layout::Gpt2);
    assert_eq!(
        err.to_string(),
        r#"no tensor "encoder.layer.0.attention.c_attn.weight" in the checkpoint; it holds no layer of this family"#
    );
}

#[test]
fn many_layers_are_listed_briefly() {
    let fx: Vec<Stored> = (0..6)
        .map(|i| f32_tensor(&format!("h.{i}.attn.c_attn.weight"), &[1, 3], vec![0.0; 3]))
        .collect();
    let err = load_err::<1>(&file(&fx), "h.9.attn", Layout::Gpt2);
    assert!(
        err.to_string()
            .ends_with(r#"in it: "h.0.attn", "h.1.attn", "h.2.attn", "h.3.attn", … (6 in all)"#),
        "{err}"
    );
}

#[test]
fn wrong_width_names_both_shapes() {
    let bytes = file(&gpt2_fixture::<6>(&mut Rng::new(64)));
    let err = load_err::<8>(&bytes, "h.0.attn", Layout::Gpt2);
    assert_eq!(
        err,
        LoadError::Shape {
            file: String::new(),
            tensor: "h.0.attn.c_attn.weight".into(),
            expected: vec![8, 24],
            actual: vec![6, 18],
        }
    );
    assert_eq!(
        err.to_string(),
        r#"tensor "h.0.attn.c_attn.weight" has shape [6, 18], expected [8, 24]"#
    );
    let bytes = file(&pytorch_fixture::<6>(&mut Rng::new(65), "attn", true));
    let err = load_err::<4>(&bytes, "attn", Layout::PytorchMha);
    assert_eq!(
        err.to_string(),
        r#"tensor "attn.in_proj_weight" has shape [18, 6], expected [12, 4]"#
    );
}

#[test]
fn one_bad_tensor_names_both_shapes() {
    const D: usize = 6;
    let mut rng = Rng::new(66);
    // c_attn.bias of 2D values instead of 3D.
    let mut fx = gpt2_fixture::<D>(&mut rng);
    let bias = fx
        .iter_mut()
        .find(|t| t.name == "h.0.attn.c_attn.bias")
        .unwrap();
    *bias = f32_tensor("h.0.attn.c_attn.bias", &[2 * D], vec![0.0; 2 * D]);
    let err = load_err::<D>(&file(&fx), "h.0.attn", Layout::Gpt2);
    assert_eq!(
        err.to_string(),
        r#"tensor "h.0.attn.c_attn.bias" has shape [12], expected [18]"#
    );
    // in_proj_weight saved transposed, (D, 3D): rejected rather than silently misread.
    let mut fx = pytorch_fixture::<D>(&mut rng, "attn", true);
    let w = fx
        .iter_mut()
        .find(|t| t.name == "attn.in_proj_weight")
        .unwrap();
    w.shape = vec![D, 3 * D];
    let err = load_err::<D>(&file(&fx), "attn", Layout::PytorchMha);
    assert_eq!(
        err.to_string(),
        r#"tensor "attn.in_proj_weight" has shape [6, 18], expected [18, 6]"#
    );
    // A BERT bias stored as (1, D).
    let mut fx = bert_fixture::<D>(&mut rng);
    let b = fx
        .iter_mut()
        .find(|t| t.name == "encoder.layer.0.attention.self.value.bias")
        .unwrap();
    b.shape = vec![1, D];
    let err = load_err::<D>(&file(&fx), "encoder.layer.0.attention", Layout::Bert);
    assert_eq!(
        err,
        LoadError::Shape {
            file: String::new(),
            tensor: "encoder.layer.0.attention.self.value.bias".into(),
            expected: vec![D],
            actual: vec![1, D],
        }
    );
}

#[test]
fn integer_tensor_is_not_converted() {
    const D: usize = 3;
    let mut fx = pytorch_fixture::<D>(&mut Rng::new(67), "attn", true);
    let b = fx
        .iter_mut()
        .find(|t| t.name == "attn.out_proj.bias")
        .unwrap();
    b.dtype = Dtype::I64;
    b.values = vec![1.0; D];
    let err = load_err::<D>(&file(&fx), "attn", Layout::PytorchMha);
    assert_eq!(
        err,
        LoadError::Dtype {
            file: String::new(),
            tensor: "attn.out_proj.bias".into(),
            dtype: Dtype::I64
        }
    );
}

#[test]
fn pytorch_half_the_biases_is_an_error() {
    const D: usize = 3;
    let fx: Vec<Stored> = pytorch_fixture::<D>(&mut Rng::new(68), "attn", true)
        .into_iter()
        .filter(|t| t.name != "attn.out_proj.bias")
        .collect();
    let err = load_err::<D>(&file(&fx), "attn", Layout::PytorchMha);
    assert!(
        matches!(err, LoadError::MissingTensor { ref tensor, .. } if tensor == "attn.out_proj.bias"),
        "{err}"
    );
    let fx: Vec<Stored> = pytorch_fixture::<D>(&mut Rng::new(68), "attn", true)
        .into_iter()
        .filter(|t| t.name != "attn.in_proj_bias")
        .collect();
    let err = load_err::<D>(&file(&fx), "attn", Layout::PytorchMha);
    assert!(
        matches!(err, LoadError::MissingTensor { ref tensor, .. } if tensor == "attn.in_proj_bias"),
        "{err}"
    );
}

#[test]
fn pytorch_features_the_layer_cannot_model_are_rejected() {
    const D: usize = 3;
    let mut fx = pytorch_fixture::<D>(&mut Rng::new(69), "attn", true);
    fx.push(f32_tensor("attn.bias_k", &[1, 1, D], vec![0.0; D]));
    fx.push(f32_tensor("attn.bias_v", &[1, 1, D], vec![0.0; D]));
    let err = load_err::<D>(&file(&fx), "attn", Layout::PytorchMha);
    assert!(
        matches!(err, LoadError::UnexpectedTensor { ref tensor, .. } if tensor == "attn.bias_k")
    );
    assert!(err
        .to_string()
        .starts_with(r#"tensor "attn.bias_k" is in the file, but add_bias_kv"#));

    // kdim/vdim != embed_dim: q_proj_weight, k_proj_weight, v_proj_weight instead of in_proj_weight.
    let fx = vec![
        f32_tensor("attn.q_proj_weight", &[D, D], vec![0.0; D * D]),
        f32_tensor("attn.k_proj_weight", &[D, 5], vec![0.0; D * 5]),
        f32_tensor("attn.v_proj_weight", &[D, 5], vec![0.0; D * 5]),
        f32_tensor("attn.out_proj.weight", &[D, D], vec![0.0; D * D]),
    ];
    let err = load_err::<D>(&file(&fx), "attn", Layout::PytorchMha);
    assert!(
        matches!(err, LoadError::UnexpectedTensor { ref tensor, .. } if tensor == "attn.q_proj_weight"),
        "{err}"
    );
}

#[test]
fn prefixes_and_names() {
    let bytes = file(&bert_fixture::<2>(&mut Rng::new(70)));
    let st = SafeTensors::parse(&bytes).unwrap();
    assert_eq!(
        Layout::Bert.prefixes_in(&st),
        ["encoder.layer.0.attention", "encoder.layer.1.attention"]
    );
    assert!(Layout::PytorchMha.prefixes_in(&st).is_empty());
    for name in Layout::Bert.tensor_names("encoder.layer.1.attention") {
        assert!(st.get(&name).is_some(), "{name}");
    }
    assert_eq!(Layout::DistilBert.tensor_names("x").len(), 8);
    assert_eq!(
        Layout::PytorchMha.to_string(),
        "PyTorch nn.MultiheadAttention"
    );
}
#[test]
fn readme_shows_the_section_and_the_picture() {
    let readme = include_str!("../README.md");
    let section = readme
        .find("## Using weights from PyTorch / Hugging Face")
        .expect("README has the section");
    assert!(
        section
            < readme
                .find("## License")
                .expect("README has a License section")
    );
    assert!(readme.contains("docs/heatmap.png"));
    let png = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/heatmap.png"))
        .expect("docs/heatmap.png exists");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}
