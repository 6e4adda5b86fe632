//! Degenerate and extreme inputs to the typed buffers, the head split, the reference, the public
//! GEMM, `causal_mask`, the safetensors reader and `config.json`: zero sizes, head counts 0, 1,
//! D, D + 1 and `usize::MAX`, sizes that overflow, headers at the format's limits, every config
//! key set to NaN, infinity, zero, negative and huge values, other JSON types or left out. Each
//! call is asserted to give its documented `Ok` value (checked against values computed here) or
//! its documented `Err`, never a panic, a wrap or a loop over empty axes; a config that loads
//! builds its layer, whose forward pass of finite input is finite.

mod common;
#[path = "common/config_keys.rs"]
mod config_keys;
#[path = "common/config_layer.rs"]
mod config_layer;
#[path = "common/hf_fixture.rs"]
mod hf_fixture;
#[path = "common/json_edit.rs"]
mod json_edit;

use common::Rng;
use config_keys::{CONFIG_KEYS, CONFIG_VALUES, ROPE_KEYS};
use config_layer::{made_up_weights, Run};
use hf_fixture::HfCase;
use json_edit::Json;
use mha::kernels::{gemm, Isa, PackedB};
use mha::safetensors::{serialize, serialize_raw, Dtype, Layout, SafeTensors, SafeTensorsError};
use mha::{causal_mask, merge_heads, mha_forward, reference, split_heads};
use mha::{AttentionConfig, ConfigError};
use mha::{Heads, Matrix, MhaParams, ShapeError, Tensor};
use mha::{LayerWeights, LoadError};

fn supported() -> impl Iterator<Item = Isa> {
    Isa::ALL.into_iter().filter(|isa| isa.is_supported())
}

fn length_mismatch(what: &'static str, expected: usize, actual: usize) -> ShapeError {
    ShapeError::LengthMismatch {
        what,
        expected,
        actual,
    }
}

// ---------------------------------------------------------------------------------------------
// Typed buffers

#[test]
fn from_fn_fills_row_major_order() {
    // Independent of the crate's index walk: the expected buffer is built by nested loops.
    let mut want = Vec::new();
    for b in 0..2 {
        for t in 0..3 {
            for i in 0..5 {
                want.push((b * 100 + t * 10 + i) as f32);
            }
        }
    }
    let x = Tensor::<2, 3, 5>::from_fn(|b, t, i| (b * 100 + t * 10 + i) as f32);
    assert_eq!(x.as_slice(), want);
    let m = Matrix::<3, 7>::from_fn(|r, c| (r * 10 + c) as f32);
    let want: Vec<f32> = (0..3)
        .flat_map(|r| (0..7).map(move |c| (r * 10 + c) as f32))
        .collect();
    assert_eq!(m.as_slice(), want);
    let t = m.transpose();
    for r in 0..7 {
        for c in 0..3 {
            assert_eq!(t.get(r, c), Some((c * 10 + r) as f32));
        }
    }
    assert_eq!(
        Matrix::<3, 3>::identity().as_slice(),
        [1., 0., 0., 0., 1., 0., 0., 0., 1.]
    );
}

#[test]
fn zero_sized_tensors_are_empty() {
    let x = Tensor::<0, 3, 4>::zeros();
    assert!(x.as_slice().is_empty());
    assert_eq!(x.get(0, 0, 0), None);
    assert_eq!(x.token(0, 0), None);
    assert_eq!(
        Tensor::<2, 0, 4>::from_vec(vec![]).map(Tensor::into_vec),
        Ok(vec![])
    );
    assert_eq!(
        Tensor::<2, 0, 4>::from_vec(vec![1.0]),
        Err(length_mismatch("Tensor (B, T, D)", 0, 1))
    );
    // No features: every token is the empty slice, even at indices whose offset would overflow.
    let x = Tensor::<{ usize::MAX }, { usize::MAX }, 0>::zeros();
    assert_eq!(x.token(usize::MAX - 1, usize::MAX - 1), Some(&[][..]));
    assert_eq!(x.token(usize::MAX, 0), None);
    assert_eq!(x.get(1, 1, 0), None);
    let x = Tensor::<2, 3, 0>::from_fn(|_, _, _| unreachable!());
    assert_eq!(x.token(1, 2), Some(&[][..]));
    assert_eq!(Tensor::<0, 0, 0>::from([]).as_slice(), &[] as &[f32]);
}

#[test]
fn empty_shapes_with_huge_axes_cost_nothing() {
    let mut calls = 0;
    let x = Tensor::<{ usize::MAX }, 0, 1>::from_fn(|_, _, _| {
        calls += 1;
        0.0
    });
    assert_eq!((x.as_slice().len(), calls), (0, 0));
    let wide = Matrix::<0, { usize::MAX }>::zeros();
    let tall: Matrix<{ usize::MAX }, 0> = wide.transpose();
    assert!(tall.as_slice().is_empty());
    assert!(tall.transpose().as_slice().is_empty());
    assert!(Matrix::<{ usize::MAX }, 0>::identity()
        .as_slice()
        .is_empty());
    assert_eq!(tall.get(5, 0), None);
    assert_eq!(
        Matrix::<0, { usize::MAX }>::from_vec(vec![0.0; 3]),
        Err(length_mismatch("Matrix (R, C)", 0, 3))
    );
}

#[test]
fn heads_constructors_with_every_head_count() {
    // D = 4: 0, D + 1 and usize::MAX are errors; 1 and D are fine.
    let data = || vec![0.0; 2 * 3 * 4];
    assert_eq!(
        Heads::<2, 3, 4>::from_vec(data(), 0),
        Err(ShapeError::ZeroHeads)
    );
    for n_heads in [5, usize::MAX] {
        assert_eq!(
            Heads::<2, 3, 4>::from_vec(data(), n_heads),
            Err(ShapeError::NotDivisible {
                d_model: 4,
                n_heads
            })
        );
    }
    for n_heads in [1, 2, 4] {
        let h = Heads::<2, 3, 4>::from_vec(data(), n_heads).unwrap();
        assert_eq!((h.n_heads(), h.head_dim()), (n_heads, 4 / n_heads));
        assert_eq!(
            h.head(1, n_heads - 1).map(<[f32]>::len),
            Some(3 * 4 / n_heads)
        );
        assert_eq!(h.head(2, 0), None);
        assert_eq!(h.head(0, n_heads), None);
    }
    assert_eq!(
        Heads::<2, 3, 4>::from_vec(vec![0.0; 23], 2),
        Err(length_mismatch("Heads (B, H, T, d)", 24, 23))
    );
    // D = 0: any head count but 0 divides it; every head is empty.
    for n_heads in [1, 2, usize::MAX] {
        let h = Heads::<2, 3, 0>::from_vec(vec![], n_heads).unwrap();
        assert_eq!((h.n_heads(), h.head_dim()), (n_heads, 0));
        assert_eq!(h.head(1, n_heads - 1), Some(&[][..]));
        assert_eq!(h.head(2, 0), None);
        assert_eq!(h.get(1, n_heads - 1, 2, 0), None);
    }
    assert_eq!(
        Heads::<2, 3, 0>::from_vec(vec![], 0),
        Err(ShapeError::ZeroHeads)
    );
    // An empty batch of huge sequences: heads exist, none can be looked at.
    let h = Heads::<0, { usize::MAX }, 2>::from_vec(vec![], 2).unwrap();
    assert_eq!(h.head(0, 0), None);
}

// ---------------------------------------------------------------------------------------------
// Splitting and merging heads

/// `(B, T, D) -> (B, H, T, d)` by the definition: element `(b, h, t, j)` is `x[b, t, h·d + j]`.
fn split_by_definition(x: &[f32], b: usize, t: usize, dm: usize, h: usize) -> Vec<f32> {
    let d = dm / h;
    let mut out = Vec::with_capacity(x.len());
    for bi in 0..b {
        for hi in 0..h {
            for ti in 0..t {
                for j in 0..d {
                    out.push(x[(bi * t + ti) * dm + hi * d + j]);
                }
            }
        }
    }
    out
}

#[test]
fn split_and_merge_with_every_head_count() {
    let x = Tensor::<2, 3, 4>::from_vec(Rng::new(7).vec(24, 1.0)).unwrap();
    for n_heads in [0, 1, 2, 4, 5, usize::MAX] {
        let split = split_heads(&x, n_heads);
        match n_heads {
            0 => assert_eq!(split, Err(ShapeError::ZeroHeads)),
            5 | usize::MAX => assert_eq!(
                split,
                Err(ShapeError::NotDivisible {
                    d_model: 4,
                    n_heads
                })
            ),
            _ => {
                let heads = split.unwrap();
                let want = split_by_definition(x.as_slice(), 2, 3, 4, n_heads);
                assert_eq!(heads.as_slice(), want, "{n_heads} heads");
                assert_eq!(merge_heads(&heads), x);
            }
        }
    }
    assert_eq!(x.split_heads_const::<1>().as_slice(), x.as_slice());
    assert_eq!(
        x.split_heads_const::<4>().as_slice(),
        split_by_definition(x.as_slice(), 2, 3, 4, 4)
    );
}

#[test]
fn split_and_merge_of_zero_width() {
    let x = Tensor::<2, 3, 0>::zeros();
    assert_eq!(split_heads(&x, 0), Err(ShapeError::ZeroHeads));
    for n_heads in [1, usize::MAX] {
        let heads = split_heads(&x, n_heads).unwrap();
        assert_eq!((heads.n_heads(), heads.as_slice().len()), (n_heads, 0));
        assert_eq!(merge_heads(&heads), x);
    }
    let heads = x.split_heads_const::<{ usize::MAX }>();
    assert_eq!(merge_heads(&heads), x);
    // Empty tensors with a huge axis split and merge at once.
    let x = Tensor::<{ usize::MAX }, 0, 4>::zeros();
    assert_eq!(merge_heads(&split_heads(&x, 2).unwrap()), x);
}

// ---------------------------------------------------------------------------------------------
// The reference

fn zero_params<const D: usize>() -> MhaParams<D> {
    MhaParams::new(
        Matrix::zeros(),
        Matrix::zeros(),
        Matrix::zeros(),
        Matrix::zeros(),
    )
}

#[test]
fn reference_on_empty_inputs_agrees_with_mha_forward() {
    let p0 = zero_params::<0>();
    let x = Tensor::<2, 3, 0>::zeros();
    let slow = reference::mha_forward(&x, &p0, 1);
    assert_eq!(slow, Ok(Tensor::zeros()));
    assert_eq!(slow, mha_forward(&x, &p0, 1));
    assert_eq!(
        reference::mha_forward(&x, &p0, 0),
        Err(ShapeError::ZeroHeads)
    );
    assert_eq!(mha_forward(&x, &p0, 0), Err(ShapeError::ZeroHeads));
    // Any head count divides D = 0: the reference gives the empty output at once.
    assert_eq!(
        reference::mha_forward(&x, &p0, usize::MAX),
        Ok(Tensor::zeros())
    );
    let p4 = zero_params::<4>();
    let empty_batch = Tensor::<0, 3, 4>::zeros();
    assert_eq!(
        reference::mha_forward(&empty_batch, &p4, 2),
        Ok(Tensor::zeros())
    );
    assert_eq!(mha_forward(&empty_batch, &p4, 2), Ok(Tensor::zeros()));
    let no_tokens = Tensor::<2, 0, 4>::zeros();
    assert_eq!(
        reference::mha_forward(&no_tokens, &p4, 4),
        Ok(Tensor::zeros())
    );
    assert_eq!(mha_forward(&no_tokens, &p4, 4), Ok(Tensor::zeros()));
    assert_eq!(
        reference::mha_forward(&no_tokens, &p4, 3),
        Err(ShapeError::NotDivisible {
            d_model: 4,
            n_heads: 3
        })
    );
    let huge_empty = Tensor::<{ usize::MAX }, 0, 4>::zeros();
    assert_eq!(
        reference::mha_forward(&huge_empty, &p4, 2),
        Ok(Tensor::zeros())
    );
}

// ---------------------------------------------------------------------------------------------
// The public GEMM

#[test]
fn gemm_with_k_zero_is_zero_for_any_rows_and_threads() {
    for isa in supported() {
        for n in [0, 1, 5, 16, 33, 70] {
            let b = PackedB::from_row_major(isa, &[], 0, n).unwrap();
            for m in (0..=40).chain([97, 200]) {
                for threads in [1, 2, 3] {
                    let mut c = vec![f32::NAN; m * n];
                    assert_eq!(gemm(&[], m, &b, &mut c, threads), Ok(()));
                    assert!(
                        c.iter().all(|&v| v.to_bits() == 0),
                        "{isa:?} m {m} n {n} threads {threads}"
                    );
                }
            }
        }
    }
}

#[test]
fn gemm_with_nothing_to_compute_and_wrong_lengths() {
    for isa in supported() {
        let b = PackedB::from_row_major(isa, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2, 3).unwrap();
        // m = 0.
        assert_eq!(gemm(&[], 0, &b, &mut [], 1), Ok(()));
        // n = 0 leaves C (empty) alone, whatever m and k.
        let b0 = PackedB::from_row_major(isa, &[], 2, 0).unwrap();
        assert_eq!(gemm(&[1.0; 10], 5, &b0, &mut [], 1), Ok(()));
        // Wrong lengths name both numbers.
        assert_eq!(
            gemm(&[1.0; 3], 2, &b, &mut [0.0; 6], 1),
            Err(length_mismatch("matrix A (m, k)", 4, 3))
        );
        assert_eq!(
            gemm(&[1.0; 4], 2, &b, &mut [0.0; 7], 1),
            Err(length_mismatch("matrix C (m, n)", 6, 7))
        );
        // Sizes past memory are Overflow, naming them.
        assert_eq!(
            gemm(&[], usize::MAX, &b, &mut [], 1),
            Err(ShapeError::Overflow {
                what: "matrix A (m, k)",
                dims: vec![usize::MAX, 2]
            })
        );
        // Thread counts 0 (the default) and usize::MAX give the one-thread bits.
        let a = [0.5, -1.0, 2.0, 0.25];
        let mut one = [0.0; 6];
        gemm(&a, 2, &b, &mut one, 1).unwrap();
        assert_eq!(one, [-3.5, -4.0, -4.5, 3.0, 5.25, 7.5]);
        for threads in [0, usize::MAX] {
            let mut c = [0.0; 6];
            assert_eq!(gemm(&a, 2, &b, &mut c, threads), Ok(()));
            assert_eq!(c.map(f32::to_bits), one.map(f32::to_bits));
        }
    }
}

#[test]
fn packing_extreme_shapes() {
    for isa in supported() {
        // Empty matrices with a huge axis exist.
        let b = PackedB::from_row_major(isa, &[], usize::MAX, 0).unwrap();
        assert_eq!((b.rows(), b.cols()), (usize::MAX, 0));
        assert_eq!(gemm(&[], 0, &b, &mut [], 1), Ok(()));
        assert!(matches!(
            gemm(&[], 1, &b, &mut [], 1),
            Err(ShapeError::Overflow { .. })
        ));
        let b = PackedB::from_row_major(isa, &[], 0, usize::MAX).unwrap();
        assert_eq!((b.rows(), b.cols()), (0, usize::MAX));
        assert_eq!(gemm(&[], 0, &b, &mut [], 1), Ok(()));
        assert_eq!(
            gemm(&[], 1, &b, &mut [], 1),
            Err(ShapeError::Overflow {
                what: "matrix C (m, n)",
                dims: vec![1, usize::MAX]
            })
        );
        // Too many values for memory: Overflow; merely more than given: LengthMismatch.
        for (k, n) in [(usize::MAX, 2), (1 << 61, 1), (2, usize::MAX)] {
            assert_eq!(
                PackedB::from_row_major(isa, &[], k, n).map(|_| ()),
                Err(ShapeError::Overflow {
                    what: "matrix B (k, n)",
                    dims: vec![k, n]
                })
            );
        }
        assert_eq!(
            PackedB::from_row_major(isa, &[], 1, 1 << 59).map(|_| ()),
            Err(length_mismatch("matrix B (k, n)", 1 << 59, 0))
        );
        assert_eq!(
            PackedB::from_row_major(isa, &[1.0], 1, 2).map(|_| ()),
            Err(length_mismatch("matrix B (k, n)", 2, 1))
        );
    }
    for isa in Isa::ALL.into_iter().filter(|isa| !isa.is_supported()) {
        assert_eq!(
            PackedB::from_row_major(isa, &[], 0, 0).map(|_| ()),
            Err(ShapeError::UnsupportedIsa { isa: isa.name() })
        );
    }
}

// ---------------------------------------------------------------------------------------------
// causal_mask

#[test]
fn causal_mask_sizes() {
    assert_eq!(causal_mask(0), Ok(vec![]));
    assert_eq!(causal_mask(1), Ok(vec![true]));
    let t = 5;
    let want: Vec<bool> = (0..t * t).map(|k| k % t <= k / t).collect();
    assert_eq!(causal_mask(t), Ok(want));
    for t in [1 << 32, usize::MAX, (isize::MAX as usize).isqrt() + 1] {
        assert_eq!(
            causal_mask(t),
            Err(ShapeError::Overflow {
                what: "causal mask (t, t)",
                dims: vec![t, t]
            })
        );
    }
    // 2^62 bytes are a valid size but more than any address space holds.
    assert_eq!(
        causal_mask(1 << 31),
        Err(ShapeError::AllocationFailed {
            what: "causal mask (t, t)",
            bytes: 1 << 62
        })
    );
    assert_eq!(
        causal_mask(1 << 32).unwrap_err().to_string(),
        "causal mask (t, t) of sizes [4294967296, 4294967296] has more elements than fit in memory"
    );
}

// ---------------------------------------------------------------------------------------------
// safetensors at the limits

/// A file whose header is `header` (unpadded) followed by `data`.
fn file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

#[test]
fn safetensors_framing_extremes() {
    assert_eq!(
        SafeTensors::parse(&[]).map(|_| ()),
        Err(SafeTensorsError::Truncated { len: 0 })
    );
    assert_eq!(
        SafeTensors::parse(&[0; 7]).map(|_| ()),
        Err(SafeTensorsError::Truncated { len: 7 })
    );
    for header_len in [u64::MAX, mha::safetensors::MAX_HEADER_LEN as u64 + 1] {
        let mut bytes = header_len.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        assert_eq!(
            SafeTensors::parse(&bytes).map(|_| ()),
            Err(SafeTensorsError::HeaderTooLarge {
                header_len,
                limit: mha::safetensors::MAX_HEADER_LEN
            })
        );
    }
    let mut bytes = (mha::safetensors::MAX_HEADER_LEN as u64)
        .to_le_bytes()
        .to_vec();
    bytes.extend_from_slice(b"{}");
    assert_eq!(
        SafeTensors::parse(&bytes).map(|_| ()),
        Err(SafeTensorsError::HeaderPastEnd {
            header_len: mha::safetensors::MAX_HEADER_LEN as u64,
            available: 2
        })
    );
    let empty = file("{}", &[]);
    let st = SafeTensors::parse(&empty).unwrap();
    assert!(st.is_empty() && st.metadata().is_empty());
}

#[test]
fn safetensors_extreme_shapes_and_offsets() {
    let parse = |header: &str, data: &[u8]| SafeTensors::parse(&file(header, data)).map(|_| ());
    let tensor = |shape: &str, offsets: &str| {
        format!(r#"{{"t": {{"dtype": "F32", "shape": {shape}, "data_offsets": {offsets}}}}}"#)
    };
    assert_eq!(
        parse(&tensor("[18446744073709551615, 2]", "[0, 0]"), &[]),
        Err(SafeTensorsError::ShapeOverflow {
            tensor: "t".into(),
            shape: vec![usize::MAX, 2]
        })
    );
    // Elements fit, bits do not.
    assert_eq!(
        parse(&tensor("[4611686018427387904]", "[0, 0]"), &[]),
        Err(SafeTensorsError::ShapeOverflow {
            tensor: "t".into(),
            shape: vec![1 << 62]
        })
    );
    assert!(matches!(
        parse(&tensor("[18446744073709551616]", "[0, 0]"), &[]),
        Err(SafeTensorsError::WrongType { found, .. }) if found.ends_with("(too large)")
    ));
    assert_eq!(
        parse(&tensor("[1]", "[0, 18446744073709551615]"), &[0; 4]),
        Err(SafeTensorsError::OffsetsOutOfRange {
            tensor: "t".into(),
            begin: 0,
            end: u64::MAX,
            data_len: 4
        })
    );
    assert_eq!(
        parse(&tensor("[1]", "[18446744073709551615, 4]"), &[0; 4]),
        Err(SafeTensorsError::OffsetsReversed {
            tensor: "t".into(),
            begin: u64::MAX,
            end: 4
        })
    );
    // An empty tensor may have a huge axis; ten thousand axes of 1 hold one value.
    let bytes = file(&tensor("[0, 18446744073709551615]", "[0, 0]"), &[]);
    let st = SafeTensors::parse(&bytes).unwrap();
    assert_eq!(st.tensor("t").unwrap().element_count(), 0);
    assert_eq!(st.tensor_f32("t").unwrap(), (vec![0, usize::MAX], vec![]));
    let ones = format!("[{}]", vec!["1"; 10_000].join(","));
    let bytes = file(&tensor(&ones, "[0, 4]"), &2.5f32.to_le_bytes());
    let st = SafeTensors::parse(&bytes).unwrap();
    assert_eq!(st.tensor_f32("t").unwrap().1, [2.5]);
}

#[test]
fn safetensors_nesting_at_the_limit() {
    let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    // The header object is level 1 and the tensor entry level 2, so an ignored field holds
    // arrays of up to 62 levels.
    let header = |depth: usize| {
        format!(
            r#"{{"t": {{"dtype": "F32", "shape": [], "data_offsets": [0, 4], "x": {}}}}}"#,
            nested(depth)
        )
    };
    assert!(SafeTensors::parse(&file(&header(62), &[0; 4])).is_ok());
    assert!(matches!(
        SafeTensors::parse(&file(&header(63), &[0; 4])),
        Err(SafeTensorsError::Json { .. })
    ));
    // Far deeper: an error at the limit, not a stack overflow.
    assert!(matches!(
        SafeTensors::parse(&file(&header(100_000), &[0; 4])),
        Err(SafeTensorsError::Json { position, .. }) if position < 200
    ));
}

#[test]
fn safetensors_writer_extremes() {
    assert_eq!(
        serialize(&[("big", &[usize::MAX, 2], &[])], &[]),
        Err(SafeTensorsError::ShapeOverflow {
            tensor: "big".into(),
            shape: vec![usize::MAX, 2]
        })
    );
    // Three F4 values are 12 bits: not whole bytes.
    assert!(matches!(
        serialize_raw(&[("f4", Dtype::F4, &[3], &[0, 0])], &[]),
        Err(SafeTensorsError::WriteLengthMismatch {
            expected: 2,
            actual: 2,
            ..
        })
    ));
    // Empty tensors with huge axes round trip.
    let bytes = serialize(&[("e", &[usize::MAX, 0], &[])], &[]).unwrap();
    let st = SafeTensors::parse(&bytes).unwrap();
    assert_eq!(st.tensor("e").unwrap().shape(), [usize::MAX, 0]);
}

/// The tensors of a layer of width `d` in `layout` at prefix `p`, all zero but one marker.
fn layer_file(layout: Layout, p: &str, d: usize) -> Vec<u8> {
    let names = layout.tensor_names(p);
    let shapes: Vec<Vec<usize>> = names
        .iter()
        .map(
            |n| match n.rsplit_once('.').map_or(n.as_str(), |(_, last)| last) {
                "in_proj_weight" => vec![3 * d, d],
                "in_proj_bias" => vec![3 * d],
                _ if n.ends_with("c_attn.weight") => vec![d, 3 * d],
                _ if n.ends_with("c_attn.bias") => vec![3 * d],
                last if last.ends_with("weight") => vec![d, d],
                _ => vec![d],
            },
        )
        .collect();
    let values: Vec<Vec<f32>> = shapes
        .iter()
        .map(|s| vec![0.0; s.iter().product()])
        .collect();
    let tensors: Vec<(&str, &[usize], &[f32])> = names
        .iter()
        .zip(&shapes)
        .zip(&values)
        .map(|((n, s), v)| (n.as_str(), s.as_slice(), v.as_slice()))
        .collect();
    serialize(&tensors, &[]).unwrap()
}

#[test]
fn layers_of_zero_and_of_huge_width() {
    for layout in [
        Layout::PytorchMha,
        Layout::Bert,
        Layout::DistilBert,
        Layout::Gpt2,
    ] {
        // D = 0: every tensor is empty, and the layer loads.
        let bytes = layer_file(layout, "l", 0);
        let st = SafeTensors::parse(&bytes).unwrap();
        let (params, biases) = MhaParams::<0>::from_safetensors(&st, "l", layout, 1).unwrap();
        assert!(params.wq.as_slice().is_empty());
        assert!(biases.bo.is_some_and(|b| b.as_slice().is_empty()));
        // A width whose fused (3D, D) tensor has 3 · 2^60 elements: its arithmetic fits, no
        // file holds it, and the error names the shape asked for.
        let bytes = layer_file(layout, "l", 2);
        let st = SafeTensors::parse(&bytes).unwrap();
        const HUGE: usize = 1 << 30;
        let err = MhaParams::<HUGE>::from_safetensors(&st, "l", layout, 1).unwrap_err();
        let expected = match layout {
            Layout::PytorchMha => vec![3 * HUGE, HUGE],
            Layout::Gpt2 => vec![HUGE, 3 * HUGE],
            _ => vec![HUGE, HUGE],
        };
        assert!(
            matches!(&err, LoadError::Shape { expected: e, actual, .. }
                if *e == expected && actual.len() == expected.len()),
            "{layout}: {err}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// config.json: every key of the fixtures' configs with NaN, infinity, 0, negative and huge
// values, other JSON types, or left out

/// Each mutation of the config `base`: the key changed (`a.b` nested, `a[i]` an array entry),
/// its new value (`None`: left out) and the text of the whole config.
fn config_mutations(base: &Json) -> Vec<(String, Option<&'static str>, String)> {
    let mut out = Vec::new();
    let values = || CONFIG_VALUES.iter().map(|v| Some(*v)).chain([None]);
    let mut keys = base.keys();
    keys.extend(CONFIG_KEYS.iter().map(|k| k.to_string()));
    keys.sort();
    keys.dedup();
    for key in keys {
        for value in values() {
            let mut json = base.clone();
            json.set(&key, value.map(|v| Json::Raw(v.to_string())));
            out.push((key.clone(), value, json.write()));
        }
    }
    for dict in ["rope_scaling", "rope_parameters"] {
        let Some(Json::Obj(_)) = base.get(dict) else {
            continue;
        };
        for key in ROPE_KEYS {
            for value in values() {
                let mut json = base.clone();
                let rope = json.get_mut(dict).unwrap();
                rope.set(key, value.map(|v| Json::Raw(v.to_string())));
                out.push((format!("{dict}.{key}"), value, json.write()));
            }
        }
    }
    if let Some(Json::Arr(types)) = base.get("layer_types") {
        let entries = [
            "\"full_attention\"",
            "\"sliding_attention\"",
            "\"chunked\"",
            "0",
            "null",
        ];
        for (i, entry) in (0..types.len()).flat_map(|i| entries.map(|e| (i, e))) {
            let mut json = base.clone();
            if let Some(Json::Arr(types)) = json.get_mut("layer_types") {
                types[i] = Json::Raw(entry.to_string());
            }
            out.push((format!("layer_types[{i}]"), Some(entry), json.write()));
        }
    }
    out
}

/// A fixture and its parsed checkpoint.
struct Case<'a> {
    hf: &'a HfCase,
    checkpoint: SafeTensors<'a>,
}

/// How a mutated config fared.
#[derive(Debug, Default)]
struct Tally {
    /// Refused with an error naming the key.
    refused: usize,
    /// Not JSON (`NaN`, `Infinity`): refused with the byte position.
    not_json: usize,
    /// Loaded, built, and the forward pass of finite input was finite.
    finite: usize,
    /// Loaded and built, but the scores of the test's input may pass `f32`'s range (a huge
    /// scale or attention factor times the weights): not checked for finiteness.
    may_overflow: usize,
    /// Loaded, describing a layer whose weights (`D · Q` floats and more) no memory holds.
    too_large: usize,
    /// Loaded as a config already built for this fixture.
    repeated: usize,
    /// The configs of this fixture built so far.
    seen: Vec<AttentionConfig>,
}

/// Checks one mutated config of `case`: refused with an error naming `key`, or built into a
/// layer whose forward pass of finite input is finite; `Err` says how it failed.
fn check_config(
    case: &Case<'_>,
    key: &str,
    value: Option<&str>,
    json: &str,
    tally: &mut Tally,
) -> Result<(), String> {
    let (st, case) = (&case.checkpoint, case.hf);
    let context = format!("{}: {key} = {value:?}", case.name);
    let config = match AttentionConfig::from_json(json, case.layer_index) {
        Ok(config) => config,
        Err(ConfigError::Json { .. }) => {
            let not_json = ["NaN", "Infinity", "-Infinity"];
            if !value.is_some_and(|v| not_json.contains(&v)) {
                return Err(format!("{context}: refused as not JSON"));
            }
            tally.not_json += 1;
            return Ok(());
        }
        Err(e) => {
            // `rope_scaling.factor` as `factor`, `layer_types[1]` as `layer_types`.
            let name = key.rsplit('.').next().unwrap().split('[').next().unwrap();
            if !e.to_string().contains(name) {
                return Err(format!("{context}: the error does not name the key: {e}"));
            }
            tally.refused += 1;
            return Ok(());
        }
    };
    config
        .validate()
        .map_err(|e| format!("{context}: loaded, then failed validate: {e}"))?;
    if tally.seen.contains(&config) {
        // The same layer as another mutation's (a key the family does not read, a default
        // written out): built and run once.
        tally.repeated += 1;
        return Ok(());
    }
    tally.seen.push(config);
    match layer_outcome(st, &config, &context)? {
        Some(true) => tally.finite += 1,
        Some(false) => tally.may_overflow += 1,
        None => tally.too_large += 1,
    }
    Ok(())
}

/// The layer of `config` built over the fixture's checkpoint when it loads with this config,
/// else over weights made up for the config's shapes, and run: `Some(true)` when the forward
/// pass was checked finite, `Some(false)` when its scores may overflow, `None` when the layer's
/// shapes are too large to hold.
fn layer_outcome(
    st: &SafeTensors<'_>,
    config: &AttentionConfig,
    context: &str,
) -> Result<Option<bool>, String> {
    let (q, kv) = (
        config.n_heads * config.head_dim,
        config.n_kv_heads * config.head_dim,
    );
    let d = config.hidden_size;
    if d.saturating_mul(q.max(kv)) > 1 << 24 {
        // Widths such as hidden_size 2^53 + 1: the config holds, its weights cannot exist.
        assert!(
            d.saturating_mul(q.max(kv)) > 1 << 40,
            "{context}: widths {d}, {kv}, {q} skipped"
        );
        return Ok(None);
    }
    let weights = LayerWeights::from_safetensors(st, &config.tensor_prefix(), config)
        .unwrap_or_else(|_| {
            let mut rng = Rng::new(19);
            made_up_weights(config, &mut |n, scale| rng.vec(n, scale))
        });
    let x = Rng::new(7).vec(2 * 9 * d, 1.0);
    let run = Run {
        config,
        weights,
        x: &x,
        context,
    };
    run.go().map(Some)
}

#[test]
fn config_values_are_refused_naming_the_key_or_build_a_finite_layer() {
    let (mut tally, mut failures) = (Tally::default(), Vec::new());
    for name in hf_fixture::case_names() {
        let case = hf_fixture::load(&name);
        let base = Json::parse(&case.config_json());
        if AttentionConfig::from_json(&base.write(), case.layer_index).is_err() {
            // GPT-J: a family the crate does not read (built by hand in hf_models).
            continue;
        }
        tally.seen.clear();
        let bytes = case.model_bytes();
        let case = Case {
            hf: &case,
            checkpoint: SafeTensors::parse(&bytes).unwrap(),
        };
        for (key, value, json) in config_mutations(&base) {
            if let Err(failure) = check_config(&case, &key, value, &json, &mut tally) {
                failures.push(failure);
            }
        }
    }
    tally.seen.clear();
    eprintln!("{tally:?}");
    let first: Vec<&String> = failures.iter().take(20).collect();
    assert!(
        failures.is_empty(),
        "{} failures, the first: {first:#?}",
        failures.len()
    );
    assert!(tally.refused > 1000 && tally.finite > 500, "{tally:?}");
}
