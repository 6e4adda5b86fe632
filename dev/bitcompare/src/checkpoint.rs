//! Checkpoint directories of every family the crate reads (config.json and safetensors written
//! with the crate's own writer into a temporary directory), in f32 and bf16 (f16 and two
//! shards for some): the file bytes, the loaded weights, and each layer's calls on 1, 2 and 3
//! threads; the same layers read from memory (`LayerWeights::from_safetensors`); and the
//! fixed layouts of `MhaParams::from_safetensors`.
use std::path::{Path, PathBuf};

use mha::safetensors::{
    read_file, serialize, serialize_index, serialize_raw, Dtype, Layout, SafeTensors,
};
use mha::*;

use crate::calls::{self_calls, Depth, Input};
use crate::layer::Shape;
use crate::{hash, seed_of, show, Rng};

/// Tokens per sequence of the checkpoints' calls (2 sequences).
const T: usize = 101;

/// Each family's config: odd widths, heads of 6 to 16, GQA, windows and several layers where
/// the family has them.
const FAMILIES: [(&str, &str); 13] = [
    (
        "llama",
        r#"{"model_type": "llama", "hidden_size": 40, "num_attention_heads": 4,
        "num_key_value_heads": 2, "num_hidden_layers": 2, "max_position_embeddings": 256,
        "attention_bias": true, "rope_theta": 10000.0, "rope_scaling": {"rope_type": "llama3",
        "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32}}"#,
    ),
    (
        "mistral",
        r#"{"model_type": "mistral", "hidden_size": 40, "num_attention_heads": 4,
        "num_key_value_heads": 1, "num_hidden_layers": 1, "sliding_window": 5,
        "rope_theta": 1000000.0}"#,
    ),
    (
        "qwen2",
        r#"{"model_type": "qwen2", "hidden_size": 36, "num_attention_heads": 6,
        "num_key_value_heads": 2, "num_hidden_layers": 2, "use_sliding_window": true,
        "sliding_window": 7, "max_window_layers": 1, "rope_scaling": {"type": "yarn",
        "factor": 4.0, "original_max_position_embeddings": 32}}"#,
    ),
    (
        "qwen3",
        r#"{"model_type": "qwen3", "hidden_size": 44, "num_attention_heads": 6,
        "num_key_value_heads": 2, "head_dim": 10, "num_hidden_layers": 1,
        "rms_norm_eps": 1e-6}"#,
    ),
    (
        "phi3",
        r#"{"model_type": "phi3", "hidden_size": 40, "num_attention_heads": 4,
        "num_key_value_heads": 2, "num_hidden_layers": 1, "partial_rotary_factor": 0.6,
        "sliding_window": 9}"#,
    ),
    (
        "phi",
        r#"{"model_type": "phi", "hidden_size": 40, "num_attention_heads": 4,
        "num_hidden_layers": 1, "partial_rotary_factor": 0.4}"#,
    ),
    (
        "gpt_neox",
        r#"{"model_type": "gpt_neox", "hidden_size": 48, "num_attention_heads": 3,
        "num_hidden_layers": 1, "rotary_pct": 0.25, "rotary_emb_base": 10000}"#,
    ),
    (
        "olmo2",
        r#"{"model_type": "olmo2", "hidden_size": 40, "num_attention_heads": 4,
        "num_key_value_heads": 2, "num_hidden_layers": 1, "rms_norm_eps": 1e-6}"#,
    ),
    (
        "gemma2",
        r#"{"model_type": "gemma2", "hidden_size": 42, "num_attention_heads": 6,
        "num_key_value_heads": 2, "head_dim": 10, "num_hidden_layers": 2,
        "query_pre_attn_scalar": 16, "attn_logit_softcapping": 20.0, "sliding_window": 4,
        "rope_theta": 500.0}"#,
    ),
    (
        "gemma3",
        r#"{"model_type": "gemma3_text", "hidden_size": 30, "num_attention_heads": 3,
        "num_key_value_heads": 1, "head_dim": 14, "num_hidden_layers": 3,
        "query_pre_attn_scalar": 10, "rope_local_base_freq": 100.0, "rope_theta": 10000.0,
        "rope_scaling": {"factor": 2.0, "rope_type": "linear"}, "sliding_window": 5,
        "sliding_window_pattern": 3}"#,
    ),
    (
        "bloom",
        r#"{"model_type": "bloom", "hidden_size": 36, "n_head": 6, "n_layer": 1}"#,
    ),
    (
        "gpt_oss",
        r#"{"model_type": "gpt_oss", "hidden_size": 36, "num_attention_heads": 6,
        "num_key_value_heads": 2, "head_dim": 10, "num_hidden_layers": 2,
        "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 4,
        "max_position_embeddings": 64, "attention_bias": true, "rope_theta": 500.0,
        "rope_scaling": {"rope_type": "yarn", "beta_fast": 32.0, "beta_slow": 1.0,
        "factor": 4.0, "original_max_position_embeddings": 16, "truncate": false}}"#,
    ),
    (
        "gpt_oss_rope_parameters",
        r#"{"model_type": "gpt_oss", "hidden_size": 36,
        "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 10,
        "num_hidden_layers": 1, "layer_types": ["full_attention"],
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
        "original_max_position_embeddings": 4096}}"#,
    ),
];

pub fn run() {
    for (family, config) in FAMILIES {
        for dtype in [Dtype::F32, Dtype::BF16] {
            checkpoint_case(family, config, dtype, 1);
        }
    }
    let config = |family: &str| FAMILIES.iter().find(|f| f.0 == family).unwrap().1;
    checkpoint_case("llama", config("llama"), Dtype::F16, 1);
    checkpoint_case("gemma2", config("gemma2"), Dtype::F16, 1);
    checkpoint_case("llama", config("llama"), Dtype::BF16, 2);
    for layout in [
        Layout::PytorchMha,
        Layout::Bert,
        Layout::DistilBert,
        Layout::Gpt2,
    ] {
        for dtype in [Dtype::F32, Dtype::BF16] {
            fixed_layout(layout, dtype);
        }
    }
    stored_values();
}

/// Every bf16 and f16 value widened by the reader, and the writer's bytes of f32 tensors.
fn stored_values() {
    let all: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
    let shape = [256, 256];
    let tensors = [
        ("bf16", Dtype::BF16, &shape[..], &all[..]),
        ("f16", Dtype::F16, &shape, &all),
    ];
    let bytes = serialize_raw(&tensors, &[]).unwrap();
    let st = SafeTensors::parse(&bytes).unwrap();
    for name in ["bf16", "f16"] {
        let (_, values) = st.tensor_f32(name).unwrap();
        show(&format!("read-{name}"), &values);
    }
    let values = Rng(seed_of("write-f32")).vec(1000, 100.0);
    let bytes = serialize(
        &[("a", &[10, 100], &values), ("b", &[], &[0.5])],
        &[("k", "v")],
    )
    .unwrap();
    println!("write-f32 {:016x}", crate::fnv(bytes));
}

/// A directory of its own under the system's temporary one, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let unique = format!("mha-bitcompare-{}-{nanos}-{name}", std::process::id());
        let dir = std::env::temp_dir().join(unique);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One checkpoint of `family` in `dtype` (`shards` files): the bytes written, the weights
/// loaded, every layer's calls on 1, 2 and 3 threads, the bytes loading read, and the layers
/// read from memory.
fn checkpoint_case(family: &str, config: &str, dtype: Dtype, shards: usize) {
    let name = format!("ckpt-{family}-{dtype}-{shards}");
    let dir = TempDir::new(&name);
    let files = write_checkpoint(&dir.0, config, dtype, shards, &mut Rng(seed_of(&name)));
    println!("{name} files {files:016x}");
    let checkpoint = Checkpoint::open(&dir.0).unwrap();
    let d = checkpoint.config(0).unwrap().hidden_size;
    let input = Input::random(&Shape::of_self(2, T, d, d, d, 1), &mut Rng(seed_of(family)));
    each_layer(&name, &checkpoint, &input);
    for threads in 1..=3 {
        let layers = checkpoint.layers_with(.., |b| b.threads(threads).min_work_per_thread(0));
        for (i, mut layer) in layers.unwrap().into_iter().enumerate() {
            self_calls(
                &format!("{name} t{threads} layer{i}"),
                &mut layer,
                &input,
                Depth::Light,
            );
        }
    }
    println!("{name} bytes_read {}", checkpoint.bytes_read());
    if shards == 1 {
        from_memory(&name, &dir.0, config, &input);
    }
}

/// Each layer's forward pass with the default settings, with the format and bytes its
/// weights are kept in (the loaded values themselves are checked by the crate's tests; their
/// type changes between revisions).
fn each_layer(name: &str, checkpoint: &Checkpoint, input: &Input) {
    for i in 0..checkpoint.num_layers() {
        let mut layer = checkpoint.layer(i).unwrap();
        let x = Tokens::new(&input.x, input.b, input.t, input.d).unwrap();
        let y = layer.forward(x).unwrap();
        let (format, bytes) = (layer.weight_format().name(), layer.weight_bytes());
        show(&format!("{name} layer{i} default {format} {bytes} bytes"), &y);
    }
}

/// The layers of the checkpoint in `dir` read from memory, on 2 threads.
fn from_memory(name: &str, dir: &Path, config: &str, input: &Input) {
    let bytes = read_file(dir.join("model.safetensors")).unwrap();
    let st = SafeTensors::parse(&bytes).unwrap();
    let layers = AttentionConfig::from_json(config, 0)
        .unwrap()
        .num_hidden_layers;
    for i in 0..layers {
        let config = AttentionConfig::from_json(config, i).unwrap();
        let weights =
            LayerWeights::from_safetensors(&st, &config.tensor_prefix(), &config).unwrap();
        let builder = weights
            .builder(&config)
            .unwrap()
            .threads(2)
            .min_work_per_thread(0);
        let mut layer = builder.build().unwrap();
        let x = Tokens::new(&input.x, input.b, input.t, input.d).unwrap();
        show(
            &format!("{name} memory layer{i}"),
            &layer.forward(x).unwrap(),
        );
    }
}

/// Named tensors about to be written, values exact in every dtype.
struct Tensors<'r> {
    list: Vec<(String, Vec<usize>, Vec<f32>)>,
    rng: &'r mut Rng,
}

impl Tensors<'_> {
    /// A tensor of `shape` with values `k / 1024`, `|k| <= 128` (exact in bf16 and f16).
    fn add(&mut self, name: String, shape: &[usize]) {
        let n = shape.iter().product();
        let values = (0..n)
            .map(|_| (self.rng.f() * 128.0).round() / 1024.0)
            .collect();
        self.list.push((name, shape.to_vec(), values));
    }

    /// `{name}.weight (rows, inputs)` and, when `bias`, `{name}.bias (rows)`.
    fn linear(&mut self, name: String, rows: usize, inputs: usize, bias: bool) {
        self.add(format!("{name}.weight"), &[rows, inputs]);
        if bias {
            self.add(format!("{name}.bias"), &[rows]);
        }
    }

    /// The attention tensors of the layer `config` describes, in its family's layout.
    fn attention(&mut self, config: &AttentionConfig) {
        let (d, hd, b) = (config.hidden_size, config.head_dim, config.biases);
        let (q, kv) = (config.n_heads * hd, config.n_kv_heads * hd);
        let p = config.tensor_prefix();
        match config.layout() {
            Layout::Phi3 => {
                self.linear(format!("{p}.qkv_proj"), q + 2 * kv, d, b.q);
                self.linear(format!("{p}.o_proj"), d, q, b.o);
            }
            Layout::GptNeox => {
                self.linear(format!("{p}.query_key_value"), 3 * q, d, b.q);
                self.linear(format!("{p}.dense"), d, q, b.o);
            }
            layout => {
                self.linear(format!("{p}.q_proj"), q, d, b.q);
                self.linear(format!("{p}.k_proj"), kv, d, b.k);
                self.linear(format!("{p}.v_proj"), kv, d, b.v);
                let output = if layout == Layout::Phi {
                    "dense"
                } else {
                    "o_proj"
                };
                self.linear(format!("{p}.{output}"), d, q, b.o);
            }
        }
        if let Some(norm) = config.qk_norm {
            let (qn, kn) = match norm.span {
                QkNormSpan::PerHead => (hd, hd),
                _ => (q, kv),
            };
            self.add(format!("{p}.q_norm.weight"), &[qn]);
            self.add(format!("{p}.k_norm.weight"), &[kn]);
        }
        if config.sinks {
            self.add(format!("{p}.sinks"), &[config.n_heads]);
        }
    }
}

/// `v` (a value `k / 1024`, `|k| <= 128`) in IEEE half.
fn f16_bits(v: f32) -> u16 {
    if v == 0.0 {
        return 0;
    }
    let bits = v.to_bits();
    let exponent = ((bits >> 23) & 0xff) as u16 + 15 - 127;
    ((bits >> 16) as u16 & 0x8000) | exponent << 10 | ((bits >> 13) & 0x3ff) as u16
}

/// The little-endian bytes of `values` in `dtype`.
fn encode(values: &[f32], dtype: Dtype) -> Vec<u8> {
    match dtype {
        Dtype::BF16 => values
            .iter()
            .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
            .collect(),
        Dtype::F16 => values
            .iter()
            .flat_map(|&v| f16_bits(v).to_le_bytes())
            .collect(),
        _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// A safetensors file of `tensors` in `dtype`.
fn file(tensors: &[(String, Vec<usize>, Vec<f32>)], dtype: Dtype) -> Vec<u8> {
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|(_, _, v)| encode(v, dtype)).collect();
    let raw: Vec<_> = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, shape, _), b)| (name.as_str(), dtype, shape.as_slice(), b.as_slice()))
        .collect();
    serialize_raw(&raw, &[("format", "pt")]).unwrap()
}

/// Writes `config` and its model (an embedding, then every layer's attention and an MLP
/// weight) into `dir`: one `model.safetensors`, or `shards` files (tensor `i` in shard
/// `i % shards`) with their index. Returns the hash of the files' bytes.
fn write_checkpoint(dir: &Path, config: &str, dtype: Dtype, shards: usize, rng: &mut Rng) -> u64 {
    std::fs::write(dir.join("config.json"), config).unwrap();
    let first = AttentionConfig::from_json(config, 0).unwrap();
    let mut tensors = Tensors {
        list: Vec::new(),
        rng,
    };
    tensors.add(
        "model.embed_tokens.weight".to_string(),
        &[16, first.hidden_size],
    );
    for i in 0..first.num_hidden_layers {
        tensors.attention(&AttentionConfig::from_json(config, i).unwrap());
        tensors.add(
            format!("model.layers.{i}.mlp.up_proj.weight"),
            &[8, first.hidden_size],
        );
    }
    let list = tensors.list;
    if shards == 1 {
        let bytes = file(&list, dtype);
        std::fs::write(dir.join("model.safetensors"), &bytes).unwrap();
        return crate::fnv(bytes);
    }
    let name = |s: usize| format!("model-{:05}-of-{shards:05}.safetensors", s + 1);
    let mut all = Vec::new();
    for s in 0..shards {
        let mine: Vec<_> = list.iter().skip(s).step_by(shards).cloned().collect();
        let bytes = file(&mine, dtype);
        std::fs::write(dir.join(name(s)), &bytes).unwrap();
        all.extend(bytes);
    }
    let names: Vec<(String, String)> = list
        .iter()
        .enumerate()
        .map(|(i, t)| (t.0.clone(), name(i % shards)))
        .collect();
    let pairs: Vec<(&str, &str)> = names
        .iter()
        .map(|(t, f)| (t.as_str(), f.as_str()))
        .collect();
    let index = serialize_index(&pairs, all.len() as u64);
    std::fs::write(dir.join("model.safetensors.index.json"), &index).unwrap();
    all.extend(index.bytes());
    crate::fnv(all)
}

/// Model width and heads of the fixed layouts' layer.
const FD: usize = 24;
const FH: usize = 4;

/// The tensors of a layer of `layout` (width 24, with biases) under `"p"`.
fn fixed_tensors(layout: Layout, rng: &mut Rng) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let mut t = Tensors {
        list: Vec::new(),
        rng,
    };
    match layout {
        Layout::PytorchMha => {
            t.add("p.in_proj_weight".to_string(), &[3 * FD, FD]);
            t.add("p.in_proj_bias".to_string(), &[3 * FD]);
            t.linear("p.out_proj".to_string(), FD, FD, true);
        }
        Layout::Gpt2 => {
            t.add("p.c_attn.weight".to_string(), &[FD, 3 * FD]);
            t.add("p.c_attn.bias".to_string(), &[3 * FD]);
            t.linear("p.c_proj".to_string(), FD, FD, true);
        }
        Layout::Bert => {
            for name in ["self.query", "self.key", "self.value", "output.dense"] {
                t.linear(format!("p.{name}"), FD, FD, true);
            }
        }
        _ => {
            for name in ["q_lin", "k_lin", "v_lin", "out_lin"] {
                t.linear(format!("p.{name}"), FD, FD, true);
            }
        }
    }
    t.list
}

/// A typed layer loaded from a file of `layout` in `dtype`: its calls on 1, 2 and 3 threads.
fn fixed_layout(layout: Layout, dtype: Dtype) {
    let name = format!("layout-{layout:?}-{dtype}");
    let mut rng = Rng(seed_of(&name));
    let bytes = file(&fixed_tensors(layout, &mut rng), dtype);
    let st = SafeTensors::parse(&bytes).unwrap();
    // Since the one loader (9c5e52c) the call takes the head count.
    #[cfg(feature = "heads-arg")]
    let (params, biases) = MhaParams::<FD>::from_safetensors(&st, "p", layout, FH).unwrap();
    #[cfg(not(feature = "heads-arg"))]
    let (params, biases) = MhaParams::<FD>::from_safetensors(&st, "p", layout).unwrap();
    let masking = match layout {
        Layout::Bert | Layout::DistilBert => Masking::Bidirectional,
        _ => Masking::Causal,
    };
    let input = Input::random(&Shape::of_self(2, 37, FD, FD, FD, FH), &mut rng);
    println!(
        "{name} params {:016x}",
        hash(
            &[
                params.wq.as_slice(),
                params.wk.as_slice(),
                params.wv.as_slice(),
                params.wo.as_slice()
            ]
            .concat()
        )
    );
    for threads in 1..=3 {
        let builder = Mha::builder(&params, FH)
            .biases(biases.clone())
            .masking(masking);
        let mha = builder
            .threads(threads)
            .min_work_per_thread(0)
            .build()
            .unwrap();
        self_calls(
            &format!("{name} t{threads}"),
            &mut mha.into_layer(),
            &input,
            Depth::Light,
        );
    }
}
