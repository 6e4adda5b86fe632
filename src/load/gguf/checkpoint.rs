//! What [`Checkpoint`](crate::Checkpoint) needs to open `.gguf` files: finding them (one file,
//! a directory holding one, or the splits `-00001-of-0000N.gguf`), reading a header from the
//! start of a file without reading its tensors, the model's per-layer configuration, and the
//! names of the attention tensors in the crate's loader (`transformers`' names) and back.

use std::collections::BTreeSet;
use std::format;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::string::{String, ToString};
use std::vec::Vec;

use super::config::{attention_config, Holds, Keys};
use super::{GgmlType, Gguf, GgufError, Metadata};
use crate::kernels::WeightFormat;
use crate::load::checkpoint::LoadError;
use crate::load::config::AttentionConfig;
use crate::load::safetensors::Dtype;

type Result<T> = core::result::Result<T, LoadError>;

/// The most bytes read to find the end of a header (metadata and tensor infos): 1 GiB. The
/// headers of published models take a few megabytes, most of it the tokenizer.
pub const MAX_GGUF_HEADER: u64 = 1 << 30;

/// The bytes read first from a file; doubled until the header fits.
const FIRST_READ: u64 = 1 << 16;

/// The GGUF files of `path`: the file itself when it ends in `.gguf`; for a directory without
/// `config.json`, its one `.gguf` file or its splits `{name}-0000i-of-0000n.gguf` in order.
/// `None` when `path` is neither (a safetensors checkpoint, or nothing to open).
///
/// # Errors
/// [`LoadError::Io`] when the directory cannot be listed, [`LoadError::NoWeights`] for
/// `.gguf` files that are neither one file nor one complete set of splits.
pub(crate) fn find_files(path: &Path) -> Result<Option<Vec<PathBuf>>> {
    if path.is_file() {
        let gguf = path.extension().is_some_and(|e| e == "gguf");
        return Ok(gguf.then(|| std::vec![path.to_path_buf()]));
    }
    if !path.is_dir() || path.join("config.json").exists() {
        return Ok(None);
    }
    let io = |e: std::io::Error| LoadError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let mut found = Vec::new();
    for entry in std::fs::read_dir(path).map_err(io)? {
        let name = entry
            .map_err(io)?
            .file_name()
            .to_string_lossy()
            .into_owned();
        if name.ends_with(".gguf") {
            found.push(name);
        }
    }
    found.sort_unstable();
    match found.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(std::vec![path.join(one)])),
        _ if is_split_set(&found) => Ok(Some(found.iter().map(|n| path.join(n)).collect())),
        _ => Err(LoadError::NoWeights {
            dir: path.display().to_string(),
            found,
        }),
    }
}

/// Whether the sorted `names` are `{stem}-{i:05}-of-{n:05}.gguf` for `i` in `1..=n`, `n` their
/// number, one stem.
fn is_split_set(names: &[String]) -> bool {
    let n = names.len();
    let Some(stem) = names[0].strip_suffix(&format!("-00001-of-{n:05}.gguf")) else {
        return false;
    };
    (1..=n).all(|i| names[i - 1] == format!("{stem}-{i:05}-of-{n:05}.gguf"))
}

/// The header of the GGUF file `file` of `len` bytes (shown as `path`), read from its start
/// in chunks that double until the header fits, and the bytes read.
///
/// # Errors
/// [`LoadError::Gguf`] for a file that is not valid GGUF, [`LoadError::TooLarge`] for a
/// header past [`MAX_GGUF_HEADER`], [`LoadError::Io`], [`LoadError::AllocationFailed`].
pub(crate) fn read_header(file: &mut File, len: u64, path: &str) -> Result<(Gguf, u64)> {
    let mut buf: Vec<u8> = Vec::new();
    let mut want = len.min(FIRST_READ);
    loop {
        grow(file, &mut buf, want, path)?;
        let error = match Gguf::parse_prefix(&buf, len) {
            Ok(gguf) => return Ok((gguf, buf.len() as u64)),
            Err(error) => error,
        };
        let read = buf.len() as u64;
        want = match &error {
            GgufError::Truncated { offset, needed, .. } if read < len => {
                let end = offset.saturating_add(*needed);
                end.max(read.saturating_mul(2)).min(len)
            }
            _ => {
                return Err(LoadError::Gguf {
                    path: String::from(path),
                    error,
                })
            }
        };
        if want > MAX_GGUF_HEADER {
            return Err(LoadError::TooLarge {
                path: String::from(path),
                len: want,
                limit: MAX_GGUF_HEADER as usize,
            });
        }
    }
}

/// Reads `file` on until `buf` holds its first `want` bytes.
fn grow(file: &mut File, buf: &mut Vec<u8>, want: u64, path: &str) -> Result<()> {
    let more = usize::try_from(want).unwrap_or(usize::MAX) - buf.len();
    buf.try_reserve_exact(more)
        .map_err(|_| LoadError::AllocationFailed {
            what: format!("the header of {path}"),
            bytes: more,
        })?;
    let read = file.take(more as u64).read_to_end(buf);
    match read {
        Ok(n) if n == more => Ok(()),
        Ok(_) => Err(LoadError::Io {
            path: String::from(path),
            message: format!("the file ended after {} of {want} bytes", buf.len()),
        }),
        Err(e) => Err(LoadError::Io {
            path: String::from(path),
            message: e.to_string(),
        }),
    }
}

/// A GGUF model's configuration: the first file's metadata and the names of every file's
/// tensors.
#[derive(Debug)]
pub(crate) struct GgufModel {
    /// The first file, as messages name it.
    pub path: String,
    metadata: Metadata,
    names: BTreeSet<String>,
}

impl Holds for GgufModel {
    fn holds(&self, name: &str) -> bool {
        self.names.contains(name)
    }
}

impl GgufModel {
    /// The model of the first file `gguf` (shown as `path`), checked to have an architecture
    /// this crate reads and a layer count.
    pub(crate) fn new(gguf: &Gguf, path: String) -> Result<Self> {
        let model = GgufModel {
            path,
            metadata: gguf.metadata().clone(),
            names: BTreeSet::new(),
        };
        model.num_layers()?;
        Ok(model)
    }

    /// Notes the tensors of one file.
    pub(crate) fn add_names(&mut self, gguf: &Gguf) {
        self.names
            .extend(gguf.tensors().iter().map(|t| t.name.clone()));
    }

    /// `{arch}.block_count`.
    pub(crate) fn num_layers(&self) -> Result<usize> {
        let keys = Keys::new(&self.metadata).map(|(keys, ..)| keys);
        keys.and_then(|keys| keys.block_count())
            .map_err(|error| self.error(error))
    }

    /// The attention of layer `layer`.
    pub(crate) fn layer(&self, layer: usize) -> Result<AttentionConfig> {
        attention_config(&self.metadata, self, layer).map_err(|error| self.error(error))
    }

    fn error(&self, error: GgufError) -> LoadError {
        LoadError::Gguf {
            path: self.path.clone(),
            error,
        }
    }
}

/// The attention tensors' names: GGUF's suffix after `blk.{i}.` and the loader's after
/// `model.layers.{i}.self_attn.`.
const NAMES: [(&str, &str); 11] = [
    ("attn_q.weight", "q_proj.weight"),
    ("attn_q.bias", "q_proj.bias"),
    ("attn_k.weight", "k_proj.weight"),
    ("attn_k.bias", "k_proj.bias"),
    ("attn_v.weight", "v_proj.weight"),
    ("attn_v.bias", "v_proj.bias"),
    ("attn_output.weight", "o_proj.weight"),
    ("attn_output.bias", "o_proj.bias"),
    ("attn_q_norm.weight", "q_norm.weight"),
    ("attn_k_norm.weight", "k_norm.weight"),
    ("attn_qkv.weight", "qkv_proj.weight"),
];

/// `(layer, suffix)` of `{prefix}{layer}.{suffix}`.
fn split_layer<'n>(name: &'n str, prefix: &str) -> Option<(&'n str, &'n str)> {
    let rest = name.strip_prefix(prefix)?;
    let (layer, suffix) = rest.split_once('.')?;
    layer
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then_some((layer, suffix))
}

/// The loader's name of the GGUF tensor `name` (`blk.3.attn_q.weight` is
/// `model.layers.3.self_attn.q_proj.weight`); other tensors keep their names.
pub(crate) fn loader_name(name: &str) -> String {
    let mapped = split_layer(name, "blk.").and_then(|(layer, suffix)| {
        let (_, hf) = NAMES.iter().find(|(g, _)| *g == suffix)?;
        Some(format!("model.layers.{layer}.self_attn.{hf}"))
    });
    mapped.unwrap_or_else(|| String::from(name))
}

/// The GGUF name of the loader's tensor or layer prefix `name` (the inverse of
/// [`loader_name`]; `model.layers.3.self_attn` is `blk.3`).
pub(crate) fn gguf_name(name: &str) -> String {
    let mapped = split_layer(name, "model.layers.").and_then(|(layer, suffix)| {
        let hf = suffix.strip_prefix("self_attn")?;
        if hf.is_empty() {
            return Some(format!("blk.{layer}"));
        }
        let (g, _) = NAMES
            .iter()
            .find(|(_, h)| Some(*h) == hf.strip_prefix('.'))?;
        Some(format!("blk.{layer}.{g}"))
    });
    mapped.unwrap_or_else(|| String::from(name))
}

/// `error` with the loader's tensor names and layer prefixes given as the GGUF file names
/// them.
pub(crate) fn in_gguf_names(error: LoadError) -> LoadError {
    match error {
        LoadError::MissingTensor {
            tensor,
            dir,
            files,
            layers,
        } => LoadError::MissingTensor {
            tensor: gguf_name(&tensor),
            dir,
            files,
            layers: layers.iter().map(|l| gguf_name(l)).collect(),
        },
        LoadError::Shape {
            file,
            tensor,
            expected,
            actual,
        } => LoadError::Shape {
            file,
            tensor: gguf_name(&tensor),
            expected: expected.into_iter().rev().collect(),
            actual: actual.into_iter().rev().collect(),
        },
        LoadError::UnexpectedTensor {
            file,
            tensor,
            reason,
        } => LoadError::UnexpectedTensor {
            file,
            tensor: gguf_name(&tensor),
            reason,
        },
        other => other,
    }
}

/// The block [`WeightFormat`] a tensor of `ty` is kept in, its bytes as they are: `Q8_0`,
/// `Q4_0`, `Q4_K`, `Q5_K` and `Q6_K`; `None` for the others (read as `f32` values).
pub(crate) fn block_format(ty: GgmlType) -> Option<WeightFormat> {
    let formats = [
        (GgmlType::Q8_0, WeightFormat::Q8_0),
        (GgmlType::Q4_0, WeightFormat::Q4_0),
        (GgmlType::Q4_K, WeightFormat::Q4_K),
        (GgmlType::Q5_K, WeightFormat::Q5_K),
        (GgmlType::Q6_K, WeightFormat::Q6_K),
    ];
    formats
        .into_iter()
        .find(|&(t, _)| t == ty)
        .map(|(_, format)| format)
}

/// The dtype the loader sees for a tensor of `ty`: the 16-bit and `f32` types as themselves
/// (so a layer of them keeps their format), the quantized types as `F32` (kept as blocks
/// when [`block_format`] has them, else read as their `f32` values).
pub(crate) fn loader_dtype(ty: GgmlType) -> Dtype {
    match ty {
        GgmlType::F16 => Dtype::F16,
        GgmlType::BF16 => Dtype::BF16,
        _ => Dtype::F32,
    }
}
