//! [`Checkpoint`]: a checkpoint directory opened — its `config.json` and the headers of its
//! weights files — from which layers are built reading only the bytes of their tensors.

use std::collections::{BTreeMap, BTreeSet};
use std::format;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::string::{String, ToString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};
use std::vec;
use std::vec::Vec;

use super::error::LoadError;
use super::latent::{mla_layer, not_attention_config};
use super::weights::{Found, LayerWeights, TensorSource};
use crate::kernels::WeightValues;
use crate::layer::latent::{MlaBuilder, MlaLayer};
use crate::layer::{Layer, LayerBuilder};
use crate::load::config::{
    read_file, AttentionConfig, ConfigError, FileError, MlaConfig, ParsedConfig, MAX_CONFIG_LEN,
};
use crate::load::gguf::checkpoint::{self as gguf, GgufModel};
use crate::load::gguf::{dequantize, GgmlType, Gguf, GgufError};
use crate::load::json::{self, Value};
use crate::load::safetensors::{
    decode_stored, header_len, read_header, Dtype, SafeTensorsError, MAX_HEADER_LEN,
};

type Result<T> = core::result::Result<T, LoadError>;

/// The name of the index of a sharded checkpoint.
pub(crate) const INDEX_FILE: &str = "model.safetensors.index.json";

/// A tensor of one of the weights files: where its bytes are.
#[derive(Debug)]
struct StoredTensor {
    /// Index into [`Checkpoint::files`].
    file: usize,
    dtype: Dtype,
    /// The ggml type of a GGUF tensor (whose `dtype` is the one the loader sees).
    ggml: Option<GgmlType>,
    shape: Vec<usize>,
    /// Byte range in the file.
    begin: u64,
    end: u64,
}

/// A weights file: its path, as messages name it, and its length and modification time when
/// its header was read.
#[derive(Debug)]
struct WeightsFile {
    path: String,
    /// Its name in the directory.
    name: String,
    stamp: Stamp,
}

/// What says a file is still the one whose header was read: its length and modification time
/// (`None` where the platform does not report it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
}

impl Stamp {
    /// The stamp of a file's metadata.
    fn of(metadata: &std::fs::Metadata) -> Self {
        Stamp {
            len: metadata.len(),
            modified: metadata.modified().ok(),
        }
    }

    /// How `now` differs from this stamp, as a message: the lengths, or the times (seconds
    /// since the Unix epoch); `None` when it does not.
    fn change(self, now: Stamp) -> Option<String> {
        if self.len != now.len {
            return Some(format!(
                "its length was {} bytes, now {}",
                self.len, now.len
            ));
        }
        let seconds = |t: Option<SystemTime>| match t.map(|t| t.duration_since(UNIX_EPOCH)) {
            Some(Ok(d)) => format!("{}.{:09} s", d.as_secs(), d.subsec_nanos()),
            _ => String::from("an unknown time"),
        };
        (self.modified != now.modified).then(|| {
            format!(
                "it was last modified at {} (Unix time), now at {}",
                seconds(self.modified),
                seconds(now.modified)
            )
        })
    }
}

/// A checkpoint directory as Hugging Face publishes them: `config.json` and the weights,
/// one `.safetensors` file or shards listed by `model.safetensors.index.json`
/// (`{"weight_map": {"tensor name": "model-00001-of-00004.safetensors", ...}}`); or a GGUF
/// model as llama.cpp stores them: a `.gguf` file, a directory holding one, or its splits
/// `-00001-of-0000N.gguf` (see [`open`](Self::open)).
///
/// [`open`](Self::open) reads `config.json` and the header of every weights file, and checks
/// them (every tensor's byte range inside its file, no tensor in two files, the index agreeing
/// with the headers); a layer is then built from its tensors alone, read from their byte
/// ranges ([`bytes_read`](Self::bytes_read) counts every byte read), after checking that its
/// file still has the length and modification time it had when opened (a file rewritten since
/// is refused, not read with its new bytes). No width appears in the caller's code: the layers
/// are [`Layer`]s, whose widths come from the config.
///
/// ```
/// use mha::safetensors::write_file;
/// use mha::{Checkpoint, Tokens};
/// let dir = std::env::temp_dir().join(format!("mha-doc-checkpoint-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// std::fs::write(dir.join("config.json"), r#"{"model_type": "llama", "hidden_size": 4,
///     "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 2}"#)?;
/// // Both layers' attention in one file, (out, in) as PyTorch stores them, and an MLP weight.
/// let mut tensors = Vec::new();
/// for layer in 0..2 {
///     for (name, rows) in [("q_proj", 4), ("k_proj", 2), ("v_proj", 2), ("o_proj", 4)] {
///         tensors.push((format!("model.layers.{layer}.self_attn.{name}.weight"), vec![rows, 4], vec![0.125f32; rows * 4]));
///     }
/// }
/// tensors.push(("model.layers.0.mlp.up_proj.weight".into(), vec![16, 4], vec![0.5; 64]));
/// let views: Vec<_> = tensors.iter().map(|(n, s, v)| (n.as_str(), s.as_slice(), v.as_slice())).collect();
/// write_file(dir.join("model.safetensors"), &views, &[])?;
///
/// let checkpoint = Checkpoint::open(&dir)?;
/// let mut layers = checkpoint.layers(..)?; // every layer
/// assert_eq!((layers.len(), layers[1].widths().kv), (2, 2));
/// let x = vec![0.1; 3 * 4];
/// let y = layers[0].forward(Tokens::new(&x, 1, 3, 4)?)?;
/// assert_eq!(y.len(), 12);
/// std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Checkpoint {
    /// The directory, as messages name it.
    dir: String,
    /// `config.json`, parsed once when opened, or a GGUF file's metadata.
    config: Config,
    num_layers: usize,
    files: Vec<WeightsFile>,
    tensors: BTreeMap<String, StoredTensor>,
    bytes_read: AtomicU64,
}

/// Where the layers' configurations come from.
#[derive(Debug)]
enum Config {
    Json(ParsedConfig),
    /// A multi-head latent attention model ([`MlaConfig`]), whose layers are [`MlaLayer`]s.
    Mla(MlaConfig),
    Gguf(GgufModel),
}

impl Checkpoint {
    /// Opens the checkpoint in `dir`: reads `config.json` and the headers of the weights files
    /// (the shards of `model.safetensors.index.json`, else `model.safetensors`, else the one
    /// `.safetensors` file), and checks them. No tensor's values are read.
    ///
    /// # Errors
    /// [`LoadError::Io`] naming a file that cannot be read (a shard the index names that is
    /// missing), [`LoadError::TooLarge`] for a `config.json` longer than
    /// [`MAX_CONFIG_LEN`](crate::MAX_CONFIG_LEN) or an index longer than
    /// [`MAX_HEADER_LEN`](crate::safetensors::MAX_HEADER_LEN), [`LoadError::Config`] for a
    /// `config.json` the crate cannot read,
    /// [`LoadError::NoWeights`], [`LoadError::Index`] for an index that is not one,
    /// [`LoadError::File`] for a weights file that is not valid safetensors (among others, one
    /// shorter than its header says), [`LoadError::TensorInTwoFiles`],
    /// [`LoadError::NotInFile`].
    ///
    /// A `.gguf` file, or a directory without `config.json` that holds one `.gguf` file or one
    /// set of splits `{name}-0000i-of-0000n.gguf`, opens as a GGUF model: each file's header
    /// is read (not its tensors), the configuration comes from the `{arch}.*` metadata of the
    /// first (architectures `llama`, `qwen2` and `qwen3`), and the attention tensors
    /// `blk.{i}.attn_q|attn_k|attn_v|attn_output(.weight|.bias)`, `attn_q_norm`,
    /// `attn_k_norm` are read when a layer is built: F32, F16 and BF16 as the safetensors ones
    /// are, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K dequantized to `f32` as ggml's
    /// reference [`dequantize`](crate::gguf::dequantize) does. `llama` files hold Q and K
    /// with each head's rows permuted by llama.cpp's converter; their layers rotate
    /// interleaved pairs ([`RopeLayout::Interleaved`](crate::RopeLayout)), which gives the
    /// outputs of the `transformers` model. A file that is not valid GGUF, or whose metadata
    /// the crate does not implement, is [`LoadError::Gguf`].
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        if let Some(files) = gguf::find_files(dir)? {
            return Self::open_gguf(dir, &files);
        }
        let shown = dir.display().to_string();
        let text = read_text(&dir.join("config.json"), MAX_CONFIG_LEN)?;
        let as_load = |error| LoadError::Config {
            dir: shown.clone(),
            error,
        };
        let (config, num_layers) = read_config(&text).map_err(as_load)?;
        let mut checkpoint = Checkpoint {
            dir: shown,
            config,
            num_layers,
            files: Vec::new(),
            tensors: BTreeMap::new(),
            bytes_read: AtomicU64::new(0),
        };
        let index_path = dir.join(INDEX_FILE);
        let index = match index_path.exists() {
            true => Some(read_index(&index_path)?),
            false => None,
        };
        let names = match &index {
            Some(weight_map) => shard_names(weight_map),
            None => vec![single_file(dir)?],
        };
        for name in names {
            checkpoint.add_file(&dir.join(name))?;
        }
        if let Some(weight_map) = index {
            checkpoint.check_index(&weight_map, dir)?;
        }
        Ok(checkpoint)
    }

    /// The number of layers (`num_hidden_layers`).
    pub fn num_layers(&self) -> usize {
        self.num_layers
    }

    /// The attention configuration of layer `layer`.
    ///
    /// # Errors
    /// [`LoadError::Config`], also for a layer past the last.
    pub fn config(&self, layer: usize) -> Result<AttentionConfig> {
        match &self.config {
            Config::Json(json) => json.layer(layer).map_err(|error| LoadError::Config {
                dir: self.dir.clone(),
                error,
            }),
            Config::Gguf(model) => model.layer(layer),
            Config::Mla(config) => Err(not_attention_config(config, &self.dir)),
        }
    }

    /// The configuration of a multi-head latent attention checkpoint (`deepseek_v3`,
    /// `kimi_k2`, `deepseek_v2`), whose layers load through [`mla_layer`](Self::mla_layer);
    /// `None` for any other.
    pub fn mla_config(&self) -> Option<&MlaConfig> {
        match &self.config {
            Config::Mla(config) => Some(config),
            _ => None,
        }
    }

    /// Layer `layer` of a multi-head latent attention checkpoint, its builder passed through
    /// `configure` first (threads, cache format, instruction set).
    ///
    /// # Errors
    /// [`LoadError::Config`] for a checkpoint that is not MLA or a layer past the last,
    /// [`LoadError::MissingTensor`], [`LoadError::Shape`] for a tensor whose shape is not the
    /// config's, what reading a tensor fails with ([`weights`](Self::weights)),
    /// [`LoadError::Layer`] when the weights and settings do not make a layer.
    pub fn mla_layer(
        &self,
        layer: usize,
        configure: impl FnOnce(MlaBuilder<'_>) -> MlaBuilder<'_>,
    ) -> Result<MlaLayer> {
        let Config::Mla(config) = &self.config else {
            let error = ConfigError::Unsupported {
                key: String::from("model_type"),
                value: String::from("(not an MLA family)"),
                reason: "Checkpoint::mla_layer loads deepseek_v3, kimi_k2 and deepseek_v2 layers",
            };
            let dir = self.dir.clone();
            return Err(LoadError::Config { dir, error });
        };
        mla_layer(self, (config, &self.dir), layer, configure)
    }

    /// The weights of layer `layer`, read from their byte ranges and checked against the
    /// config (see [`LayerWeights::from_safetensors`] for the tensors of each family).
    ///
    /// # Errors
    /// As [`config`](Self::config), [`LayerWeights::from_safetensors`], and
    /// [`LoadError::Io`] when a file cannot be read, [`LoadError::FileChanged`] when a weights
    /// file's length or modification time is not what it was when the checkpoint was opened.
    pub fn weights(&self, layer: usize) -> Result<LayerWeights> {
        let config = self.config(layer)?;
        self.load(&config)
    }

    /// The weights of the layer `config` describes, errors naming the tensors as the files
    /// name them.
    fn load(&self, config: &AttentionConfig) -> Result<LayerWeights> {
        let weights = LayerWeights::load(self, &config.tensor_prefix(), config, &self.dir);
        match self.config {
            Config::Json(_) | Config::Mla(_) => weights,
            Config::Gguf(_) => weights.map_err(gguf::in_gguf_names),
        }
    }

    /// Layer `layer`, as its config describes it, with the builder's default thread count and
    /// instruction set.
    ///
    /// # Errors
    /// As [`weights`](Self::weights), and [`LoadError::Layer`] when the weights and settings
    /// do not make a layer.
    pub fn layer(&self, layer: usize) -> Result<Layer> {
        self.layer_with(layer, |builder| builder)
    }

    /// Layer `layer`, its builder passed through `configure` first (for the thread count, the
    /// instruction set, a shared [`ThreadPool`](crate::ThreadPool), ...).
    ///
    /// # Errors
    /// As [`layer`](Self::layer).
    pub fn layer_with(
        &self,
        layer: usize,
        configure: impl FnOnce(LayerBuilder<'_>) -> LayerBuilder<'_>,
    ) -> Result<Layer> {
        let config = self.config(layer)?;
        let weights = self.load(&config)?;
        let as_layer = |error| LoadError::Layer { layer, error };
        let builder = weights.builder(&config).map_err(as_layer)?;
        configure(builder).build().map_err(as_layer)
    }

    /// The layers in `range` (`..` for all, `3..5`, `..=0`), in order.
    ///
    /// # Errors
    /// As [`layer`](Self::layer), for the first layer that fails (a range past the last layer
    /// fails there).
    pub fn layers(&self, range: impl RangeBounds<usize>) -> Result<Vec<Layer>> {
        self.layers_with(range, |builder| builder)
    }

    /// The layers in `range`, each builder passed through `configure` first.
    ///
    /// # Errors
    /// As [`layers`](Self::layers).
    pub fn layers_with(
        &self,
        range: impl RangeBounds<usize>,
        mut configure: impl FnMut(LayerBuilder<'_>) -> LayerBuilder<'_>,
    ) -> Result<Vec<Layer>> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.saturating_add(1),
            Bound::Excluded(&e) => e,
            Bound::Unbounded => self.num_layers,
        };
        (start..end)
            .map(|layer| self.layer_with(layer, &mut configure))
            .collect()
    }

    /// The bytes read from the weights files so far: their headers, then each tensor read.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }

    /// Reads the header of the weights file at `path` and adds its tensors.
    fn add_file(&mut self, path: &Path) -> Result<()> {
        let shown = path.display().to_string();
        let io = |e: std::io::Error| io_error(path, &e);
        let mut file = File::open(path).map_err(io)?;
        let stamp = Stamp::of(&file.metadata().map_err(io)?);
        let len = stamp.len;
        let bad = |error| LoadError::File {
            path: shown.clone(),
            error,
        };
        let mut first = [0u8; 8];
        if len < 8 {
            return Err(bad(SafeTensorsError::Truncated { len: len as usize }));
        }
        file.read_exact(&mut first).map_err(io)?;
        let header_len = header_len(first, len - 8).map_err(bad)?;
        let mut header = zeroed(header_len, || format!("the header of {shown}"))?;
        file.read_exact(&mut header).map_err(io)?;
        self.bytes_read
            .fetch_add(8 + header_len as u64, Ordering::Relaxed);
        let data_start = 8 + header_len as u64;
        let data_len = usize::try_from(len - data_start).unwrap_or(usize::MAX);
        let (entries, _) = read_header(&header, data_len).map_err(bad)?;
        let index = self.files.len();
        let name = path.file_name().unwrap_or_default();
        self.files.push(WeightsFile {
            path: shown,
            name: name.to_string_lossy().into_owned(),
            stamp,
        });
        for entry in entries {
            let stored = StoredTensor {
                file: index,
                dtype: entry.dtype,
                ggml: None,
                shape: entry.shape,
                begin: data_start + entry.begin,
                end: data_start + entry.end,
            };
            if let Some(other) = self.tensors.get(&entry.name) {
                return Err(LoadError::TensorInTwoFiles {
                    tensor: entry.name,
                    first: self.files[other.file].path.clone(),
                    second: self.files[index].path.clone(),
                });
            }
            self.tensors.insert(entry.name, stored);
        }
        Ok(())
    }

    /// Opens the GGUF model of `files` (opened as `path`): every file's header, the
    /// configuration from the first one's metadata.
    fn open_gguf(path: &Path, files: &[PathBuf]) -> Result<Self> {
        let mut headers = Vec::new();
        let mut read = 0;
        for file in files {
            let (gguf, file, bytes) = read_gguf(file)?;
            read += bytes;
            headers.push((gguf, file));
        }
        let Some((first, first_file)) = headers.first() else {
            return Err(LoadError::NoWeights {
                dir: path.display().to_string(),
                found: Vec::new(),
            });
        };
        let mut model = GgufModel::new(first, first_file.path.clone())?;
        for (gguf, _) in &headers {
            model.add_names(gguf);
        }
        let mut checkpoint = Checkpoint {
            dir: path.display().to_string(),
            num_layers: model.num_layers()?,
            config: Config::Gguf(model),
            files: Vec::new(),
            tensors: BTreeMap::new(),
            bytes_read: AtomicU64::new(read),
        };
        for (gguf, file) in headers {
            checkpoint.add_gguf(&gguf, file)?;
        }
        Ok(checkpoint)
    }

    /// Adds the tensors of the GGUF file `file` whose header is `gguf`, each under the name
    /// the loader asks for ([`gguf::loader_name`]), its shape row-major.
    fn add_gguf(&mut self, gguf: &Gguf, file: WeightsFile) -> Result<()> {
        let index = self.files.len();
        for t in gguf.tensors() {
            let shape: Option<Vec<usize>> = t
                .shape()
                .into_iter()
                .map(|d| usize::try_from(d).ok())
                .collect();
            let Some(shape) = shape else {
                let error = GgufError::BadShape {
                    tensor: t.name.clone(),
                    reason: format!("the dimensions {:?} pass usize", t.dims),
                };
                let path = file.path.clone();
                return Err(LoadError::Gguf { path, error });
            };
            let range = gguf.range(t);
            let stored = StoredTensor {
                file: index,
                dtype: gguf::loader_dtype(t.ggml_type),
                ggml: Some(t.ggml_type),
                shape,
                begin: range.start,
                end: range.end,
            };
            if let Some(other) = self.tensors.insert(gguf::loader_name(&t.name), stored) {
                return Err(LoadError::TensorInTwoFiles {
                    tensor: t.name.clone(),
                    first: self.files[other.file].path.clone(),
                    second: file.path,
                });
            }
        }
        self.files.push(file);
        Ok(())
    }

    /// Every tensor of the index is in the file the index names.
    fn check_index(&self, weight_map: &[(String, String)], dir: &Path) -> Result<()> {
        for (tensor, file) in weight_map {
            let path = dir.join(file).display().to_string();
            let stored = self.tensors.get(tensor);
            if stored.is_none_or(|stored| self.files[stored.file].path != path) {
                return Err(LoadError::NotInFile {
                    tensor: tensor.clone(),
                    file: path,
                });
            }
        }
        Ok(())
    }
}

/// The configuration in `text` and its layer count: an attention family's, else an MLA
/// family's (a `model_type` the attention families do not know).
fn read_config(text: &str) -> core::result::Result<(Config, usize), ConfigError> {
    let config = ParsedConfig::parse(text)?;
    match config.first_attention_layer() {
        Ok(first) => Ok((Config::Json(config), first.num_hidden_layers)),
        Err(error @ ConfigError::UnknownModelType { .. }) => match MlaConfig::from_json(text) {
            Ok(mla) => {
                let layers = mla.num_hidden_layers;
                Ok((Config::Mla(mla), layers))
            }
            Err(ConfigError::UnknownModelType { .. }) => Err(error),
            Err(mla_error) => Err(mla_error),
        },
        Err(error) => Err(error),
    }
}

impl TensorSource for Checkpoint {
    fn find(&self, name: &str) -> Option<Found<'_>> {
        self.tensors.get(name).map(|t| Found {
            dtype: t.dtype,
            shape: &t.shape,
            file: &self.files[t.file].path,
        })
    }

    fn stored(&self, name: &str) -> Result<WeightValues> {
        let Some(t) = self.tensors.get(name) else {
            let (dir, files) = self.searched();
            return Err(LoadError::MissingTensor {
                tensor: String::from(name),
                dir,
                files,
                layers: Vec::new(),
            });
        };
        let WeightsFile { path, stamp, .. } = &self.files[t.file];
        let io = |e: std::io::Error| io_error(Path::new(path), &e);
        // `end - begin` bytes fitted in the file, whose length fits in u64; on 32-bit targets a
        // tensor too large to address fails to allocate below.
        let len = usize::try_from(t.end - t.begin).unwrap_or(usize::MAX);
        let what = || format!("the values of tensor \"{name}\"");
        let mut file = File::open(path).map_err(io)?;
        let now = Stamp::of(&file.metadata().map_err(io)?);
        if let Some(change) = stamp.change(now) {
            return Err(LoadError::FileChanged {
                path: path.clone(),
                change,
            });
        }
        let mut bytes = zeroed(len, what)?;
        file.seek(SeekFrom::Start(t.begin)).map_err(io)?;
        file.read_exact(&mut bytes).map_err(io)?;
        self.bytes_read.fetch_add(len as u64, Ordering::Relaxed);
        if let Some(ty) = t.ggml {
            let values = dequantize(&gguf::gguf_name(name), ty, &bytes);
            return values
                .map(WeightValues::F32)
                .map_err(|error| LoadError::Gguf {
                    path: path.clone(),
                    error,
                });
        }
        decode_stored(name, t.dtype, &bytes).map_err(|error| match error {
            SafeTensorsError::AllocationFailed { bytes, .. } => LoadError::AllocationFailed {
                what: what(),
                bytes,
            },
            error => LoadError::File {
                path: path.clone(),
                error,
            },
        })
    }

    fn names(&self) -> Vec<&str> {
        self.tensors.keys().map(String::as_str).collect()
    }

    fn searched(&self) -> (String, Vec<String>) {
        let files = self.files.iter().map(|file| file.name.clone()).collect();
        (self.dir.clone(), files)
    }
}

/// The header of the GGUF file at `path`, the file as [`Checkpoint::files`] keeps it, and the
/// bytes read.
fn read_gguf(path: &Path) -> Result<(Gguf, WeightsFile, u64)> {
    let shown = path.display().to_string();
    let io = |e: std::io::Error| io_error(path, &e);
    let mut file = File::open(path).map_err(io)?;
    let stamp = Stamp::of(&file.metadata().map_err(io)?);
    let (gguf, read) = gguf::read_header(&mut file, stamp.len, &shown)?;
    let name = path.file_name().unwrap_or_default();
    let file = WeightsFile {
        path: shown,
        name: name.to_string_lossy().into_owned(),
        stamp,
    };
    Ok((gguf, file, read))
}

/// `len` zero bytes, allocated fallibly: [`LoadError::AllocationFailed`] for `what()` when
/// the memory cannot be had.
fn zeroed(len: usize, what: impl FnOnce() -> String) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(len)
        .map_err(|_| LoadError::AllocationFailed {
            what: what(),
            bytes: len,
        })?;
    bytes.resize(len, 0);
    Ok(bytes)
}

/// [`LoadError::Io`] naming `path`.
fn io_error(path: &Path, e: &std::io::Error) -> LoadError {
    LoadError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

/// The text of the file at `path`, of at most `limit` bytes ([`LoadError::TooLarge`] when
/// longer, before reading it).
fn read_text(path: &Path, limit: usize) -> Result<String> {
    read_file(path, limit).map_err(|e| match e {
        FileError::Io(e) => io_error(path, &e),
        FileError::TooLarge { len } => LoadError::TooLarge {
            path: path.display().to_string(),
            len,
            limit,
        },
    })
}

/// The weights file of an unsharded checkpoint: `model.safetensors`, as `transformers` names
/// it, else the one `.safetensors` file of `dir` (several without an index are ambiguous).
fn single_file(dir: &Path) -> Result<String> {
    const NAME: &str = "model.safetensors";
    if dir.join(NAME).is_file() {
        return Ok(String::from(NAME));
    }
    let entries = std::fs::read_dir(dir).map_err(|e| io_error(dir, &e))?;
    let mut found = Vec::new();
    for entry in entries {
        let name = entry.map_err(|e| io_error(dir, &e))?.file_name();
        let name = name.to_string_lossy();
        if name.ends_with(".safetensors") {
            found.push(name.into_owned());
        }
    }
    found.sort_unstable();
    match <[String; 1]>::try_from(found) {
        Ok([name]) => Ok(name),
        Err(found) => Err(LoadError::NoWeights {
            dir: dir.display().to_string(),
            found,
        }),
    }
}

/// The distinct files of a weight map, in the order they first appear.
fn shard_names(weight_map: &[(String, String)]) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut names = Vec::new();
    for (_, file) in weight_map {
        if seen.insert(file.as_str()) {
            names.push(file.clone());
        }
    }
    names
}

/// The `weight_map` of the index at `path`: `(tensor, file)` pairs, each file a plain name in
/// the index's directory.
fn read_index(path: &Path) -> Result<Vec<(String, String)>> {
    let text = read_text(path, MAX_HEADER_LEN)?;
    let bad = |reason: String| LoadError::Index {
        path: path.display().to_string(),
        reason,
    };
    let value = json::parse(&text).map_err(|e| bad(json_reason(e)))?;
    let Value::Object(members) = value else {
        return Err(bad(String::from("the index must be a JSON object")));
    };
    let mut maps = members.into_iter().filter(|(key, _)| key == "weight_map");
    let weight_map = match (maps.next(), maps.next()) {
        (Some((_, Value::Object(map))), None) => map,
        (None, _) => return Err(bad(String::from("\"weight_map\" is missing"))),
        (Some(_), Some(_)) => return Err(bad(String::from("\"weight_map\" appears twice"))),
        (Some(_), None) => return Err(bad(String::from("\"weight_map\" must be an object"))),
    };
    check_weight_map(path, &weight_map)?;
    // Every file is a string, checked above.
    let pairs = weight_map
        .into_iter()
        .filter_map(|(tensor, file)| match file {
            Value::String(file) => Some((tensor, file)),
            _ => None,
        });
    Ok(pairs.collect())
}

/// Checks the entries of the `weight_map` of the index at `path` in order: each a plain file
/// name, no tensor twice (looked up among the earlier ones in a map: `O(n log n)` for `n`).
fn check_weight_map(path: &Path, weight_map: &[(String, Value<'_>)]) -> Result<()> {
    let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
    for (tensor, file) in weight_map {
        let file = match file {
            Value::String(file) if is_file_name(file) => file,
            other => {
                let found = match other {
                    Value::String(s) => format!("\"{s}\""),
                    _ => String::from("not a string"),
                };
                return Err(LoadError::Index {
                    path: path.display().to_string(),
                    reason: format!(
                        "\"weight_map\".\"{tensor}\" must name a file in the directory, found {found}"
                    ),
                });
            }
        };
        if let Some(first) = seen.insert(tensor, file) {
            return Err(LoadError::TensorInTwoFiles {
                tensor: tensor.clone(),
                first: String::from(first),
                second: file.clone(),
            });
        }
    }
    Ok(())
}

/// A plain file name: not empty, no directory part, not `.` or `..`.
fn is_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\'])
}

/// A JSON error as text.
fn json_reason(e: json::JsonError) -> String {
    match e {
        json::JsonError::Syntax { position, reason } => {
            format!("bad JSON at byte {position}: {reason}")
        }
        json::JsonError::AllocationFailed { position, bytes } => {
            format!("cannot allocate {bytes} bytes for the value at byte {position}")
        }
    }
}
