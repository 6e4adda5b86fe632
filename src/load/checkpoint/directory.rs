//! [`Checkpoint`]: a checkpoint directory opened — its `config.json` and the headers of its
//! weights files — from which layers are built reading only the bytes of their tensors.

use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::string::{String, ToString};
use std::vec;
use std::vec::Vec;

use super::error::LoadError;
use super::files::{read_gguf, read_index, read_text, shard_names, single_file};
use super::files::{WeightsFiles, INDEX_FILE};
use super::latent::{mla_layer, not_attention_config};
use super::weights::LayerWeights;
use crate::layer::latent::{MlaBuilder, MlaLayer};
use crate::layer::{Layer, LayerBuilder};
use crate::load::config::{AttentionConfig, ConfigError, MlaConfig, ParsedConfig, MAX_CONFIG_LEN};
use crate::load::gguf::checkpoint::{self as gguf, GgufModel};

type Result<T> = core::result::Result<T, LoadError>;

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
    /// The weights files and the tensors their headers list.
    files: WeightsFiles,
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
    /// first (architectures `llama`, `qwen2`, `qwen3`, `phi3` and `olmo2`), and the attention tensors
    /// `blk.{i}.attn_q|attn_k|attn_v|attn_qkv|attn_output(.weight|.bias)`, `attn_q_norm`,
    /// `attn_k_norm` are read when a layer is built: F32, F16 and BF16 as the safetensors ones
    /// are; Q8_0, Q4_0, Q4_K, Q5_K and Q6_K kept as their blocks
    /// ([`WeightValues::Blocks`](crate::WeightValues)), so that a layer holds the file's
    /// bytes, built in the type its four projections share, or, when their types differ (a
    /// `Q4_K_M` file's Q4_K and Q6_K), each in its own
    /// ([`LayerBuilder::stored_weight_formats`](crate::LayerBuilder::stored_weight_formats));
    /// Q4_1, Q5_0 and Q5_1 as the `f32` values of ggml's reference
    /// [`dequantize`](crate::gguf::dequantize). `llama` files hold Q and K
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
        let mut files = WeightsFiles::new(shown.clone(), 0);
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
            files.add_safetensors(&dir.join(name))?;
        }
        if let Some(weight_map) = index {
            files.check_index(&weight_map, dir)?;
        }
        Ok(Checkpoint {
            dir: shown,
            config,
            num_layers,
            files,
        })
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

    /// The layer whose cache layer `layer` attends over, when it is KV-shared (Gemma 4's last
    /// `num_kv_shared_layers` layers: [`AttentionConfig::kv_source`]); `None` when it projects
    /// its own keys and values. A shared layer ([`layer`](Self::layer) builds it without key
    /// and value projections) runs [`Layer::decode_shared_into`](crate::Layer::decode_shared_into) over the source layer's
    /// cache, after the source layer's step on the same tokens.
    ///
    /// # Errors
    /// As [`config`](Self::config).
    pub fn kv_source(&self, layer: usize) -> Result<Option<usize>> {
        Ok(self.config(layer)?.kv_source)
    }

    /// The configuration of a multi-head latent attention checkpoint (`deepseek_v3`,
    /// `kimi_k2`, `deepseek_v2`, `mistral4`, `longcat_flash`), whose layers load through
    /// [`mla_layer`](Self::mla_layer); `None` for any other.
    pub fn mla_config(&self) -> Option<&MlaConfig> {
        match &self.config {
            Config::Mla(config) => Some(config),
            _ => None,
        }
    }

    /// Layer `layer` of a multi-head latent attention checkpoint, its builder passed through
    /// `configure` first (threads, cache format, instruction set). LongCat-Flash's layers hold
    /// two MLA blocks each: `layer` counts blocks, `2 · i + b` being block `b` (`self_attn.{b}`)
    /// of layer `i` ([`MlaConfig::tensor_prefix`]), each its own [`MlaLayer`] with its own
    /// cache.
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
                reason: "Checkpoint::mla_layer loads deepseek_v3, kimi_k2, deepseek_v2, mistral4 and longcat_flash layers",
            };
            let dir = self.dir.clone();
            return Err(LoadError::Config { dir, error });
        };
        mla_layer(&self.files, (config, &self.dir), layer, configure)
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
        let weights = LayerWeights::load(&self.files, &config.tensor_prefix(), config, &self.dir);
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
        self.files.bytes_read()
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
        let dir = path.display().to_string();
        let mut files = WeightsFiles::new(dir.clone(), read);
        for (gguf, file) in headers {
            files.add_gguf(&gguf, file)?;
        }
        Ok(Checkpoint {
            dir,
            num_layers: model.num_layers()?,
            config: Config::Gguf(model),
            files,
        })
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
