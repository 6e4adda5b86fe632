//! [`LoadError`]: why the attention layers of a checkpoint could not be loaded.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

use crate::error::ShapeError;
use crate::load::config::ConfigError;
use crate::load::gguf::GgufError;
use crate::load::safetensors::{Dtype, SafeTensorsError};

/// Why a checkpoint's attention layers could not be loaded: its `config.json`, its index, a
/// weights file or a tensor, or the layer the weights make.
///
/// Every variant names the file (its path; empty for a buffer already in memory) and the key
/// or tensor at fault, and its [`Display`](fmt::Display) text gives the numbers involved, e.g.
/// `model-00002-of-00002.safetensors: tensor "model.layers.3.self_attn.k_proj.weight" has
/// shape [256, 1024], expected [128, 1024]`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoadError {
    /// Reading a file (or listing the directory) failed.
    Io {
        /// The path.
        path: String,
        /// The operating system's message.
        message: String,
    },
    /// `config.json` or `model.safetensors.index.json` is longer than its limit
    /// ([`MAX_CONFIG_LEN`](crate::MAX_CONFIG_LEN) for the config,
    /// [`MAX_HEADER_LEN`](crate::safetensors::MAX_HEADER_LEN) for the index), so it is not read.
    TooLarge {
        /// The path.
        path: String,
        /// Its length in bytes (for a file that grew while read, or is not a regular file,
        /// the bytes read before stopping: one more than the limit).
        len: u64,
        /// The limit.
        limit: usize,
    },
    /// `config.json` does not describe an attention layer the crate implements (or the layer
    /// asked for is not in the model).
    Config {
        /// The directory `config.json` is in (empty when it came from elsewhere).
        dir: String,
        /// What is wrong, naming `config.json`, the key and the value.
        error: ConfigError,
    },
    /// A weights file is not a valid safetensors file (its header, offsets or length).
    File {
        /// The file.
        path: String,
        /// What is wrong with it.
        error: SafeTensorsError,
    },
    /// A `.gguf` file is not valid GGUF, or its metadata does not describe an attention layer
    /// the crate implements, or a tensor's type is not read.
    Gguf {
        /// The file.
        path: String,
        /// What is wrong, naming the offset, key or tensor and the numbers.
        error: GgufError,
    },
    /// The directory holds neither `model.safetensors.index.json` nor one `.safetensors` file.
    NoWeights {
        /// The directory.
        dir: String,
        /// The `.safetensors` files found (none, or more than one without an index).
        found: Vec<String>,
    },
    /// `model.safetensors.index.json` is not an index: not JSON, no `weight_map` object, or an
    /// entry that is not a file name.
    Index {
        /// The path of the index.
        path: String,
        /// What is wrong, naming the key.
        reason: String,
    },
    /// Two weights files hold a tensor of the same name, so which one counts is ambiguous.
    TensorInTwoFiles {
        /// The tensor.
        tensor: String,
        /// One file that holds it.
        first: String,
        /// Another file that holds it.
        second: String,
    },
    /// A weights file changed after [`Checkpoint::open`](crate::Checkpoint::open) read its
    /// header (its length or modification time is not what it was then), so its byte ranges
    /// may no longer hold the tensors the header listed; checked before each tensor is read.
    FileChanged {
        /// The file.
        path: String,
        /// How: the lengths, or the modification times, then and now.
        change: String,
    },
    /// The index names a file for a tensor that the file's header does not list.
    NotInFile {
        /// The tensor.
        tensor: String,
        /// The file the index names.
        file: String,
    },
    /// A tensor of the layer is in none of the files.
    MissingTensor {
        /// The tensor's full name.
        tensor: String,
        /// The checkpoint directory (empty for a buffer in memory).
        dir: String,
        /// The weights files searched, by their names in `dir` (empty for a buffer in memory).
        files: Vec<String>,
        /// The layers of the same family the files do hold (their prefixes).
        layers: Vec<String>,
    },
    /// A tensor does not have the shape the config implies.
    Shape {
        /// The file that holds it.
        file: String,
        /// The tensor.
        tensor: String,
        /// The shape the config implies.
        expected: Vec<usize>,
        /// The shape in the file.
        actual: Vec<usize>,
    },
    /// A tensor is stored in a dtype that does not convert to `f32` (only `F32`, `F16` and
    /// `BF16` do).
    Dtype {
        /// The file that holds it.
        file: String,
        /// The tensor.
        tensor: String,
        /// Its dtype.
        dtype: Dtype,
    },
    /// A tensor the config says the layer does not have is in the files (a bias where the
    /// config gives none, QK-norm weights in a family without QK-norm), so loading without it
    /// would compute another model.
    UnexpectedTensor {
        /// The file that holds it.
        file: String,
        /// The tensor.
        tensor: String,
        /// What the config says instead.
        reason: &'static str,
    },
    /// The weights, with the config's settings, do not make a layer (a setting out of its
    /// range, memory that cannot be had).
    Layer {
        /// The layer index.
        layer: usize,
        /// Why.
        error: ShapeError,
    },
    /// The weights do not make the typed parameters asked for
    /// ([`MhaParams::from_safetensors`](crate::MhaParams::from_safetensors)): a head count
    /// that is 0 or does not divide the width.
    Typed {
        /// Why, naming the numbers.
        error: ShapeError,
    },
    /// Memory for a tensor's values (or a header) could not be allocated.
    AllocationFailed {
        /// What the memory is for, e.g. `the values of tensor "w"`.
        what: String,
        /// The bytes asked for.
        bytes: usize,
    },
}

/// Formats up to four layer prefixes (or file names), quoted.
fn list(f: &mut fmt::Formatter<'_>, items: &[String]) -> fmt::Result {
    const SHOWN: usize = 4;
    for (i, item) in items.iter().take(SHOWN).enumerate() {
        let sep = if i == 0 { "" } else { ", " };
        write!(f, "{sep}\"{item}\"")?;
    }
    if items.len() > SHOWN {
        write!(f, ", … ({} in all)", items.len())?;
    }
    Ok(())
}

/// `file: `, or nothing for a buffer in memory.
fn at(f: &mut fmt::Formatter<'_>, file: &str) -> fmt::Result {
    if file.is_empty() {
        Ok(())
    } else {
        write!(f, "{file}: ")
    }
}

/// The message of [`LoadError::MissingTensor`]: the tensor, where it was looked for (the
/// directory and its weights files, one named alone; neither for a buffer in memory), and the
/// layers of the family the files hold.
fn missing(
    f: &mut fmt::Formatter<'_>,
    tensor: &str,
    (dir, files): (&str, &[String]),
    layers: &[String],
) -> fmt::Result {
    match files {
        [file] if !dir.is_empty() => write!(f, "{dir}: no tensor \"{tensor}\" in {file}; ")?,
        [_, _, ..] if !dir.is_empty() => {
            write!(f, "{dir}: no tensor \"{tensor}\" in its weights files ")?;
            list(f, files)?;
            write!(f, "; ")?
        }
        _ => {
            at(f, dir)?;
            write!(f, "no tensor \"{tensor}\" in the checkpoint; ")?
        }
    }
    if layers.is_empty() {
        write!(f, "it holds no layer of this family")
    } else {
        write!(f, "layers of this family in it: ")?;
        list(f, layers)
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use LoadError::*;
        match self {
            Io { path, message } => write!(f, "{path}: {message}"),
            TooLarge { path, len, limit } => {
                write!(f, "{path}: {len} bytes, more than the limit of {limit}")
            }
            Config { dir, error } if dir.is_empty() => write!(f, "{error}"),
            Config { dir, error } => write!(f, "{dir}/{error}"),
            File { path, error } => write!(f, "{path}: {error}"),
            Gguf { path, error } => write!(f, "{path}: {error}"),
            NoWeights { dir, found } if found.is_empty() => write!(
                f,
                "{dir}: no model.safetensors.index.json and no .safetensors file"
            ),
            NoWeights { dir, found } => {
                write!(f, "{dir}: no model.safetensors.index.json to choose among ")?;
                list(f, found)
            }
            Index { path, reason } => write!(f, "{path}: {reason}"),
            TensorInTwoFiles {
                tensor,
                first,
                second,
            } => write!(f, "tensor \"{tensor}\" is in both {first} and {second}"),
            FileChanged { path, change } => write!(
                f,
                "{path}: the file changed after the checkpoint was opened: {change}"
            ),
            NotInFile { tensor, file } => write!(
                f,
                "{file}: the index puts tensor \"{tensor}\" here, but the file's header does not list it"
            ),
            MissingTensor { .. } | Shape { .. } | Dtype { .. } | UnexpectedTensor { .. } => {
                self.fmt_tensor(f)
            }
            Layer { layer, error } => write!(f, "layer {layer}: {error}"),
            Typed { error } => write!(f, "the typed parameters: {error}"),
            AllocationFailed { what, bytes } => write!(f, "cannot allocate {bytes} bytes for {what}"),
        }
    }
}

impl LoadError {
    /// The message of an error about one tensor (missing, of the wrong shape or dtype, or not
    /// expected).
    fn fmt_tensor(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use LoadError::*;
        match self {
            MissingTensor {
                tensor,
                dir,
                files,
                layers,
            } => missing(f, tensor, (dir, files), layers),
            Shape {
                file,
                tensor,
                expected,
                actual,
            } => {
                at(f, file)?;
                write!(
                    f,
                    "tensor \"{tensor}\" has shape {actual:?}, expected {expected:?}"
                )
            }
            Dtype {
                file,
                tensor,
                dtype,
            } => {
                at(f, file)?;
                write!(
                    f,
                    "tensor \"{tensor}\" has dtype {dtype}, which does not convert to f32 (only F32, F16 and BF16 do)"
                )
            }
            UnexpectedTensor {
                file,
                tensor,
                reason,
            } => {
                at(f, file)?;
                write!(f, "tensor \"{tensor}\" is in the file, but {reason}")
            }
            // Display formats the others.
            _ => Ok(()),
        }
    }
}

impl core::error::Error for LoadError {}
