//! Checkpoint directories (`Checkpoint`): a Llama-shaped model written here with the crate's
//! writer as one `model.safetensors` or as shards with their index (a layer's tensors split
//! across two shards, F32, F16 and BF16), loaded whole, by range and by layer. Each layer's
//! weights equal the stored matrices transposed by a plain loop, and its output equals a layer
//! built by hand from those; only the headers and the attention tensors' bytes are read
//! (counted, against the files' own header lengths and the tensors' sizes). Broken checkpoints
//! — a missing shard, a tensor in two shards, an index that disagrees with a header, a shard
//! shorter than its header says, a wrong dtype or shape, a bad index — are `LoadError`s whose
//! messages name the file, the tensor and the numbers. An index of 200,000 entries opens (its
//! entries are looked up in maps, not among all earlier ones); a `config.json` or an index past
//! its size limit is refused unread; a shard rewritten after opening is refused, not read.

#![cfg(feature = "std")]

mod common;

use std::path::{Path, PathBuf};

use common::{assert_bits_eq, f32_tensor, file as safetensors_file, Rng, Stored};
use mha::safetensors::{serialize_index, Dtype, MAX_HEADER_LEN};
use mha::{Checkpoint, Layer, LoadError, Projections, Tokens, WeightFormat, Widths};
use mha::{ConfigError, MAX_CONFIG_LEN};

/// D = 12, 3 query heads and 1 key/value head of 4 (KV = 4), 3 layers, RoPE.
const CONFIG: &str = r#"{"model_type": "llama", "hidden_size": 12, "num_attention_heads": 3,
    "num_key_value_heads": 1, "num_hidden_layers": 3, "max_position_embeddings": 64,
    "rope_theta": 10000.0}"#;
const D: usize = 12;
const KV: usize = 4;
const LAYERS: usize = 3;

/// A fresh directory for one test.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mha-checkpoint-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The model's tensors: per layer the four attention projections (PyTorch's `(out, in)`), and
/// an MLP weight and the embedding that loading must not read. Values exact in F16 and BF16.
fn model_tensors(dtype: Dtype) -> Vec<Stored> {
    let mut rng = Rng::new(5);
    let mut tensors = Vec::new();
    let mut add = |name: String, shape: &[usize]| {
        let n: usize = shape.iter().product();
        let values = (0..n)
            .map(|_| ((rng.next_u64() % 256) as f32 - 128.0) / 256.0)
            .collect();
        tensors.push(Stored {
            name,
            dtype,
            shape: shape.to_vec(),
            values,
        });
    };
    add(String::from("model.embed_tokens.weight"), &[200, D]);
    for layer in 0..LAYERS {
        let p = format!("model.layers.{layer}");
        for (name, shape) in [
            ("q_proj", [D, D]),
            ("k_proj", [KV, D]),
            ("v_proj", [KV, D]),
            ("o_proj", [D, D]),
        ] {
            add(format!("{p}.self_attn.{name}.weight"), &shape);
        }
        add(format!("{p}.mlp.up_proj.weight"), &[4 * D, D]);
    }
    tensors
}

/// Writes `config` and `tensors` into `dir`: one `model.safetensors` for one shard, else
/// `model-0000i-of-0000n.safetensors` (tensor `t` in shard `shard_of(t)`) and the index.
fn write_checkpoint(
    dir: &Path,
    config: &str,
    tensors: &[Stored],
    shards: usize,
    shard_of: impl Fn(usize) -> usize,
) {
    std::fs::write(dir.join("config.json"), config).unwrap();
    if shards == 1 {
        std::fs::write(dir.join("model.safetensors"), safetensors_file(tensors)).unwrap();
        return;
    }
    let name = |s: usize| format!("model-{:05}-of-{shards:05}.safetensors", s + 1);
    let mut weight_map = Vec::new();
    for s in 0..shards {
        let mine: Vec<Stored> = (0..tensors.len())
            .filter(|&t| shard_of(t) == s)
            .map(|t| tensors[t].clone())
            .collect();
        std::fs::write(dir.join(name(s)), safetensors_file(&mine)).unwrap();
        weight_map.extend(mine.into_iter().map(|t| (t.name, name(s))));
    }
    let pairs: Vec<(&str, &str)> = weight_map
        .iter()
        .map(|(t, f)| (t.as_str(), f.as_str()))
        .collect();
    let index = serialize_index(&pairs, 0);
    std::fs::write(dir.join("model.safetensors.index.json"), index).unwrap();
}

/// The shard layout of the tests: the embedding and layer 0 in shard 0, layer 2 in shard 1,
/// and layer 1 split (its query and key in shard 0, value and output in shard 1).
fn two_shards(t: usize) -> usize {
    // Tensor order: embedding, then 5 per layer (q, k, v, o, mlp).
    match t {
        0 => 0,
        t => {
            let (layer, part) = ((t - 1) / 5, (t - 1) % 5);
            match layer {
                0 => 0,
                1 => usize::from(part >= 2),
                _ => 1,
            }
        }
    }
}

/// The stored `(rows, cols)` matrix named `name`, transposed to `(cols, rows)` by a plain loop.
fn transposed(tensors: &[Stored], name: &str) -> Vec<f32> {
    let t = tensors.iter().find(|t| t.name == name).unwrap();
    let (rows, cols) = (t.shape[0], t.shape[1]);
    let mut out = vec![0.0; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = t.values[r * cols + c];
        }
    }
    out
}

/// The expected `x @ W` projections of `layer`.
fn expected(tensors: &[Stored], layer: usize) -> [Vec<f32>; 4] {
    let p = format!("model.layers.{layer}.self_attn");
    ["q_proj", "k_proj", "v_proj", "o_proj"]
        .map(|n| transposed(tensors, &format!("{p}.{n}.weight")))
}

/// The header bytes of every weights file in `dir` (8 plus the header length each states).
fn header_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .map(|p| {
            let bytes = std::fs::read(p).unwrap();
            8 + u64::from_le_bytes(bytes[..8].try_into().unwrap())
        })
        .sum()
}

/// A layer built by hand from `weights`, with the config's rotary embedding.
fn by_hand(weights: &[Vec<f32>; 4], checkpoint: &Checkpoint) -> Layer {
    let config = checkpoint.config(0).unwrap();
    let [wq, wk, wv, wo] = weights;
    let projections = Projections::new(Widths::self_attention(D, KV, D), wq, wk, wv, wo).unwrap();
    Layer::builder(projections, 3)
        .rope(config.rope.unwrap())
        .threads(1)
        .build()
        .unwrap()
}

#[test]
fn every_layer_of_one_file_and_of_shards() {
    for (case, dtype) in [Dtype::F32, Dtype::F16, Dtype::BF16]
        .into_iter()
        .enumerate()
    {
        let tensors = model_tensors(dtype);
        for shards in [1, 2] {
            let dir = temp_dir(&format!("layers-{case}-{shards}"));
            write_checkpoint(&dir, CONFIG, &tensors, shards, two_shards);
            let checkpoint = Checkpoint::open(&dir).unwrap();
            assert_eq!(checkpoint.num_layers(), LAYERS);
            assert_eq!(
                checkpoint.bytes_read(),
                header_bytes(&dir),
                "only the headers"
            );
            let mut layers = checkpoint.layers_with(.., |b| b.threads(1)).unwrap();
            assert_eq!(layers.len(), LAYERS);
            // Only the attention tensors' bytes were read, not the MLP's or the embedding's.
            let attention = LAYERS * (2 * D * D + 2 * KV * D) * dtype.bits() / 8;
            assert_eq!(
                checkpoint.bytes_read(),
                header_bytes(&dir) + attention as u64
            );
            let x = Rng::new(9).vec(2 * 5 * D, 1.0);
            for (i, layer) in layers.iter_mut().enumerate() {
                let context = format!("{dtype} {shards} shard(s), layer {i}");
                let want = expected(&tensors, i);
                let weights = checkpoint.weights(i).unwrap();
                let matrices = [&weights.wq, &weights.wk, &weights.wv, &weights.wo];
                assert_eq!(matrices.map(|w| w.to_f32()), want, "{context}");
                // A 16-bit checkpoint's layer keeps its weights in 16 bits: half the bytes
                // of the f32 layer, the same bits.
                let (format, halves) = match dtype {
                    Dtype::F16 => (WeightFormat::F16, 2),
                    Dtype::BF16 => (WeightFormat::Bf16, 2),
                    _ => (WeightFormat::F32, 1),
                };
                assert_eq!(layer.weight_format(), format, "{context}");
                // The matrices are kept as stored, not widened.
                assert!(matrices.iter().all(|w| w.format() == format), "{context}");
                let mut f32_layer = by_hand(&want, &checkpoint);
                assert_eq!(halves * layer.weight_bytes(), f32_layer.weight_bytes());
                let y = layer.forward(Tokens::new(&x, 2, 5, D).unwrap()).unwrap();
                let y_by_hand = f32_layer
                    .forward(Tokens::new(&x, 2, 5, D).unwrap())
                    .unwrap();
                assert_bits_eq(&y, &y_by_hand, &context);
            }
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}

#[test]
fn ranges_and_single_layers() {
    let dir = temp_dir("ranges");
    write_checkpoint(&dir, CONFIG, &model_tensors(Dtype::F32), 2, two_shards);
    let checkpoint = Checkpoint::open(&dir).unwrap();
    assert_eq!(checkpoint.layers(1..3).unwrap().len(), 2);
    assert_eq!(checkpoint.layers(..=0).unwrap().len(), 1);
    assert!(checkpoint.layers(2..2).unwrap().is_empty());
    let layer = checkpoint.layer(1).unwrap();
    assert_eq!(
        (layer.n_heads(), layer.n_kv_heads(), layer.widths().kv),
        (3, 1, KV)
    );
    let err = checkpoint.layers(2..4).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}/config.json: layer 3 is out of range: \"num_hidden_layers\" = 3",
            dir.display()
        )
    );
    // The typed route over the same layer.
    let typed = mha::Mha::<D, D, KV>::try_from(checkpoint.layer(2).unwrap()).unwrap();
    assert_eq!(typed.n_heads(), 3);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A sharded checkpoint altered by `alter` (given the directory and the shard names), then
/// opened and its layers loaded: the error.
fn broken(name: &str, alter: impl FnOnce(&Path, [String; 2])) -> (LoadError, PathBuf) {
    let dir = temp_dir(name);
    write_checkpoint(&dir, CONFIG, &model_tensors(Dtype::F32), 2, two_shards);
    let shards = [1, 2].map(|s| format!("model-{s:05}-of-00002.safetensors"));
    alter(&dir, shards);
    let err = Checkpoint::open(&dir)
        .and_then(|c| c.layers(..))
        .unwrap_err();
    (err, dir)
}

#[test]
fn broken_shards_are_errors_naming_the_file() {
    let (err, dir) = broken("missing", |dir, [_, second]| {
        std::fs::remove_file(dir.join(second)).unwrap()
    });
    let path = |file: &str| dir.join(file).display().to_string();
    assert!(
        matches!(&err, LoadError::Io { path: p, .. } if *p == path("model-00002-of-00002.safetensors")),
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with(&path("model-00002-of-00002.safetensors")),
        "{err}"
    );

    // Shard 2 cut short by 10 bytes: its last tensor runs past the end.
    let (err, dir) = broken("short", |dir, [_, second]| {
        let bytes = std::fs::read(dir.join(&second)).unwrap();
        std::fs::write(dir.join(second), &bytes[..bytes.len() - 10]).unwrap();
    });
    let file = dir
        .join("model-00002-of-00002.safetensors")
        .display()
        .to_string();
    let message = err.to_string();
    assert!(
        message.starts_with(&format!("{file}: tensor \"")),
        "{message}"
    );
    assert!(message.contains("past the end of the"), "{message}");

    // The same tensor in both shards' headers.
    let (err, dir) = broken("twice", |dir, [_, second]| {
        let mut tensors = read_all(&dir.join(&second));
        tensors.push(Stored {
            name: String::from("model.layers.0.self_attn.q_proj.weight"),
            dtype: Dtype::F32,
            shape: vec![D, D],
            values: vec![0.5; D * D],
        });
        std::fs::write(dir.join(&second), safetensors_file(&tensors)).unwrap();
    });
    assert_eq!(
        err.to_string(),
        format!(
            "tensor \"model.layers.0.self_attn.q_proj.weight\" is in both {} and {}",
            dir.join("model-00001-of-00002.safetensors").display(),
            dir.join("model-00002-of-00002.safetensors").display()
        )
    );

    // The index puts a tensor in the shard that does not hold it.
    let (err, dir) = broken("index-disagrees", |dir, _| {
        let index = std::fs::read_to_string(dir.join("model.safetensors.index.json")).unwrap();
        let moved = index.replacen(
            "\"model.layers.2.self_attn.o_proj.weight\":\"model-00002-of-00002.safetensors\"",
            "\"model.layers.2.self_attn.o_proj.weight\":\"model-00001-of-00002.safetensors\"",
            1,
        );
        assert_ne!(moved, index);
        std::fs::write(dir.join("model.safetensors.index.json"), moved).unwrap();
    });
    assert_eq!(
        err.to_string(),
        format!(
            "{}: the index puts tensor \"model.layers.2.self_attn.o_proj.weight\" here, but the file's header does not list it",
            dir.join("model-00001-of-00002.safetensors").display()
        )
    );
}

/// Every tensor of the safetensors file at `path`, as F32 `Stored` values.
fn read_all(path: &Path) -> Vec<Stored> {
    let bytes = std::fs::read(path).unwrap();
    let st = mha::safetensors::SafeTensors::parse(&bytes).unwrap();
    st.names()
        .map(|name| {
            let (shape, values) = st.tensor_f32(name).unwrap();
            Stored {
                name: String::from(name),
                dtype: Dtype::F32,
                shape,
                values,
            }
        })
        .collect()
}

/// Replaces tensor `name` of the shard at `path` with `stored`.
fn replace(path: &Path, name: &str, stored: Stored) {
    let mut tensors = read_all(path);
    let slot = tensors.iter_mut().find(|t| t.name == name).unwrap();
    *slot = stored;
    std::fs::write(path, safetensors_file(&tensors)).unwrap();
}

#[test]
fn wrong_dtypes_and_shapes_name_the_file_and_tensor() {
    let k = "model.layers.1.self_attn.v_proj.weight";
    let (err, dir) = broken("shape", |dir, [_, second]| {
        let stored = Stored {
            name: String::from(k),
            dtype: Dtype::F32,
            shape: vec![D, D],
            values: vec![0.5; D * D],
        };
        replace(&dir.join(second), k, stored);
    });
    let file = dir
        .join("model-00002-of-00002.safetensors")
        .display()
        .to_string();
    assert_eq!(
        err.to_string(),
        format!("{file}: tensor \"{k}\" has shape [12, 12], expected [4, 12]")
    );
    // An integer tensor where a weight should be.
    let dir = temp_dir("dtype");
    let mut tensors = model_tensors(Dtype::F32);
    let slot = tensors.iter_mut().find(|t| t.name == k).unwrap();
    slot.dtype = Dtype::I64;
    write_checkpoint(&dir, CONFIG, &tensors, 2, two_shards);
    let err = Checkpoint::open(&dir).unwrap().layer(1).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("{file}: tensor \"{k}\" has dtype I64, which does not convert to f32 (only F32, F16 and BF16 do)", file = dir.join("model-00002-of-00002.safetensors").display())
    );
}

/// A missing tensor names the directory, the weights file (or the shards) and the tensor, and
/// lists the layers the files hold. (It named neither the directory nor the file.)
#[test]
fn a_missing_tensor_names_the_directory_and_files() {
    let mut tensors = model_tensors(Dtype::F32);
    tensors.retain(|t| t.name != "model.layers.2.self_attn.q_proj.weight");
    let layers =
        "layers of this family in it: \"model.layers.0.self_attn\", \"model.layers.1.self_attn\"";
    let dir = temp_dir("missing-tensor");
    write_checkpoint(&dir, CONFIG, &tensors, 1, |_| 0);
    let err = Checkpoint::open(&dir).unwrap().layer(2).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}: no tensor \"model.layers.2.self_attn.q_proj.weight\" in model.safetensors; {layers}",
            dir.display()
        )
    );
    let dir = temp_dir("missing-tensor-sharded");
    write_checkpoint(&dir, CONFIG, &tensors, 2, two_shards);
    let err = Checkpoint::open(&dir).unwrap().layer(2).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}: no tensor \"model.layers.2.self_attn.q_proj.weight\" in its weights files \"model-00001-of-00002.safetensors\", \"model-00002-of-00002.safetensors\"; {layers}",
            dir.display()
        )
    );
    assert!(
        matches!(&err, LoadError::MissingTensor { dir: d, files, .. } if *d == dir.display().to_string() && files.len() == 2),
        "{err:?}"
    );
}

#[test]
fn bad_indexes_and_directories() {
    let index_of = |dir: &Path| {
        dir.join("model.safetensors.index.json")
            .display()
            .to_string()
    };
    let with_index = |name: &str, index: &str| {
        let (err, dir) = broken(name, |dir, _| {
            std::fs::write(dir.join("model.safetensors.index.json"), index).unwrap()
        });
        (err.to_string(), index_of(&dir))
    };
    let (message, index) = with_index("not-json", "{\"weight_map\": ");
    assert_eq!(
        message,
        format!("{index}: bad JSON at byte 15: unexpected end of JSON, expected a value")
    );
    let (message, index) = with_index("no-map", "{\"metadata\": {}}");
    assert_eq!(message, format!("{index}: \"weight_map\" is missing"));
    let (message, index) = with_index(
        "not-a-file",
        r#"{"weight_map": {"a": "../model.safetensors"}}"#,
    );
    assert_eq!(
        message,
        format!("{index}: \"weight_map\".\"a\" must name a file in the directory, found \"../model.safetensors\"")
    );
    let (message, index) = with_index("number", r#"{"weight_map": {"a": 3}}"#);
    assert_eq!(
        message,
        format!(
            "{index}: \"weight_map\".\"a\" must name a file in the directory, found not a string"
        )
    );

    // No weights at all; two files and no index; no config.
    let dir = temp_dir("empty");
    std::fs::write(dir.join("config.json"), CONFIG).unwrap();
    assert_eq!(
        Checkpoint::open(&dir).unwrap_err().to_string(),
        format!(
            "{}: no model.safetensors.index.json and no .safetensors file",
            dir.display()
        )
    );
    for name in ["a.safetensors", "b.safetensors"] {
        std::fs::write(dir.join(name), safetensors_file(&[])).unwrap();
    }
    assert_eq!(
        Checkpoint::open(&dir).unwrap_err().to_string(),
        format!("{}: no model.safetensors.index.json to choose among \"a.safetensors\", \"b.safetensors\"", dir.display())
    );
    std::fs::remove_file(dir.join("config.json")).unwrap();
    let err = Checkpoint::open(&dir).unwrap_err();
    assert!(
        err.to_string()
            .starts_with(&format!("{}: ", dir.join("config.json").display())),
        "{err}"
    );
    std::fs::write(dir.join("config.json"), CONFIG.replace("llama", "llamaX")).unwrap();
    let err = Checkpoint::open(&dir).unwrap_err();
    assert!(
        err.to_string().starts_with(&format!(
            "{}/config.json: \"model_type\" = \"llamaX\" is not supported",
            dir.display()
        )),
        "{err}"
    );
}

/// A sharded checkpoint whose index lists `extra` empty tensors besides the model's, half in
/// each shard: it opens, its layers load, and only the headers and the attention tensors are
/// read. `Checkpoint::open` looked each index entry up among all earlier ones (to refuse a
/// tensor listed twice, and to list the distinct shards): quadratic, 1.5 s for 20,000 entries
/// and minutes for 200,000.
fn open_with_extra_tensors(extra: usize) {
    let dir = temp_dir(&format!("index-{extra}"));
    let mut tensors = model_tensors(Dtype::F32);
    let model = tensors.len();
    tensors.extend((0..extra).map(|i| Stored {
        name: format!("model.extra.{i}.weight"),
        dtype: Dtype::F32,
        shape: vec![0],
        values: Vec::new(),
    }));
    write_checkpoint(&dir, CONFIG, &tensors, 2, |t| match t < model {
        true => two_shards(t),
        false => t % 2,
    });
    let checkpoint = Checkpoint::open(&dir).unwrap();
    assert_eq!(checkpoint.bytes_read(), header_bytes(&dir));
    assert_eq!(checkpoint.layers(..).unwrap().len(), LAYERS);
    let attention = LAYERS * (2 * D * D + 2 * KV * D) * 4;
    assert_eq!(
        checkpoint.bytes_read(),
        header_bytes(&dir) + attention as u64
    );
    // The first tensor listed again, last, in the other shard: refused, naming both.
    let index_path = dir.join("model.safetensors.index.json");
    let index = std::fs::read_to_string(&index_path).unwrap();
    let again = r#","model.embed_tokens.weight":"model-00002-of-00002.safetensors"}}"#;
    let index = format!("{}{again}", index.strip_suffix("}}").unwrap());
    std::fs::write(&index_path, index).unwrap();
    assert_eq!(
        Checkpoint::open(&dir).unwrap_err().to_string(),
        "tensor \"model.embed_tokens.weight\" is in both model-00001-of-00002.safetensors and model-00002-of-00002.safetensors"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// 200,000 index entries: a size at which the quadratic look-ups took minutes.
#[test]
fn an_index_of_200_000_entries_opens() {
    open_with_extra_tensors(200_000);
}

/// A file of `len` bytes at `path` that takes no space: a sparse file of zeros.
fn sparse(path: &Path, len: usize) {
    let file = std::fs::File::create(path).unwrap();
    file.set_len(len as u64).unwrap();
}

/// A `config.json` or an index longer than its limit is refused before it is read, naming the
/// file, its length and the limit; one that has no length (`/dev/zero`) is read one byte past
/// the limit and refused. They were read whole, however long (and `/dev/zero` for ever).
#[test]
fn oversized_configs_and_indexes_are_not_read() {
    let dir = temp_dir("oversized");
    write_checkpoint(&dir, CONFIG, &model_tensors(Dtype::F32), 2, two_shards);
    let config = dir.join("config.json");
    sparse(&config, MAX_CONFIG_LEN + 1);
    let err = Checkpoint::open(&dir).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}: 16000001 bytes, more than the limit of 16000000",
            config.display()
        )
    );
    let too_large = |err: &LoadError, len: u64, max: usize| matches!(err, LoadError::TooLarge { len: l, limit, .. } if (*l, *limit) == (len, max));
    assert!(too_large(&err, 16_000_001, MAX_CONFIG_LEN), "{err:?}");
    // At the limit it is read: zeros are not JSON.
    sparse(&config, MAX_CONFIG_LEN);
    let err = Checkpoint::open(&dir).unwrap_err();
    assert!(
        matches!(
            &err,
            LoadError::Config {
                error: ConfigError::Json { position: 0, .. },
                ..
            }
        ),
        "{err:?}"
    );
    #[cfg(unix)]
    {
        std::fs::remove_file(&config).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &config).unwrap();
        let err = Checkpoint::open(&dir).unwrap_err();
        assert!(too_large(&err, 16_000_001, MAX_CONFIG_LEN), "{err:?}");
        std::fs::remove_file(&config).unwrap();
    }
    std::fs::write(&config, CONFIG).unwrap();
    let index = dir.join("model.safetensors.index.json");
    sparse(&index, MAX_HEADER_LEN + 1);
    let err = Checkpoint::open(&dir).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}: 100000001 bytes, more than the limit of 100000000",
            index.display()
        )
    );
    assert!(too_large(&err, 100_000_001, MAX_HEADER_LEN), "{err:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A shard rewritten after `Checkpoint::open` is refused when a tensor is read from it, naming
/// the file and what changed: rewritten with other values but the same length (its
/// modification time set a second later, as a rewrite on a coarse clock might not), or cut
/// short. Layers whose tensors are all in the other shard still load. (It was read silently,
/// with its new bytes.)
#[test]
fn a_shard_changed_after_open_is_refused() {
    let dir = temp_dir("changed");
    let tensors = model_tensors(Dtype::F32);
    write_checkpoint(&dir, CONFIG, &tensors, 2, two_shards);
    let second = dir.join("model-00002-of-00002.safetensors");
    let checkpoint = Checkpoint::open(&dir).unwrap();
    let opened = std::fs::metadata(&second).unwrap();
    let k = "model.layers.2.self_attn.k_proj.weight";
    replace(&second, k, f32_tensor(k, &[KV, D], vec![0.75; KV * D]));
    assert_eq!(std::fs::metadata(&second).unwrap().len(), opened.len());
    let later = opened.modified().unwrap() + std::time::Duration::from_secs(1);
    let file = std::fs::File::options().write(true).open(&second).unwrap();
    file.set_modified(later).unwrap();
    let err = checkpoint.layer(2).unwrap_err();
    let shown = second.display();
    let message = err.to_string();
    assert!(
        message.starts_with(&format!(
            "{shown}: the file changed after the checkpoint was opened: it was last modified at "
        )),
        "{message}"
    );
    assert!(
        matches!(&err, LoadError::FileChanged { path, .. } if *path == shown.to_string()),
        "{err:?}"
    );
    // Layer 0 is in the first shard, which is as it was.
    let want = expected(&tensors, 0);
    assert_eq!(checkpoint.weights(0).unwrap().wk.to_f32(), want[1]);
    // Cut short by 4 bytes.
    file.set_len(opened.len() - 4).unwrap();
    let err = checkpoint.weights(1).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{shown}: the file changed after the checkpoint was opened: its length was {} bytes, now {}",
            opened.len(),
            opened.len() - 4
        )
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
