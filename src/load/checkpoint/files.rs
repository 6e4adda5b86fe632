//! [`WeightsFiles`]: the weights files of a checkpoint (safetensors files or shards, or GGUF
//! files) and the tensors their headers list, each a byte range of one file, read only when
//! a layer asks for it ([`TensorSource`]); the reading and checking of those files, their
//! headers and a sharded checkpoint's index.

use std::collections::{BTreeMap, BTreeSet};
use std::format;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::string::{String, ToString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};
use std::vec::Vec;

use super::error::LoadError;
use super::weights::{Found, TensorSource};
use crate::kernels::WeightValues;
use crate::load::config::{read_file, FileError};
use crate::load::gguf::checkpoint::{self as gguf};
use crate::load::gguf::{dequantize, GgmlType, Gguf, GgufError};
use crate::load::json::{self, Value};
use crate::load::safetensors::{
    decode_stored, header_len, read_header, Dtype, SafeTensorsError, MAX_HEADER_LEN,
};

type Result<T> = core::result::Result<T, LoadError>;

/// The name of the index of a sharded checkpoint.
pub(crate) const INDEX_FILE: &str = "model.safetensors.index.json";

/// The weights files of a checkpoint and the tensors their headers list (no tensor in two
/// files), with the bytes read from them so far.
#[derive(Debug)]
pub(super) struct WeightsFiles {
    /// The directory, as messages name it.
    dir: String,
    files: Vec<WeightsFile>,
    tensors: BTreeMap<String, StoredTensor>,
    bytes_read: AtomicU64,
}

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
pub(super) struct WeightsFile {
    /// The path, as messages name it.
    pub(super) path: String,
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

impl WeightsFiles {
    /// No files yet, in the directory `dir` (for messages), `bytes_read` bytes read already.
    pub(super) fn new(dir: String, bytes_read: u64) -> Self {
        WeightsFiles {
            dir,
            files: Vec::new(),
            tensors: BTreeMap::new(),
            bytes_read: AtomicU64::new(bytes_read),
        }
    }

    /// The bytes read from the files so far: their headers, then each tensor read.
    pub(super) fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }

    /// Reads the header of the weights file at `path` and adds its tensors.
    pub(super) fn add_safetensors(&mut self, path: &Path) -> Result<()> {
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

    /// Adds the tensors of the GGUF file `file` whose header is `gguf`, each under the name
    /// the loader asks for ([`gguf::loader_name`]), its shape row-major.
    pub(super) fn add_gguf(&mut self, gguf: &Gguf, file: WeightsFile) -> Result<()> {
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
    pub(super) fn check_index(&self, weight_map: &[(String, String)], dir: &Path) -> Result<()> {
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

impl TensorSource for WeightsFiles {
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
        let ggml = t
            .ggml
            .filter(|&ty| gguf::loader_dtype(ty) == Dtype::F32 && ty != GgmlType::F32);
        if let Some(format) = ggml.and_then(gguf::block_format) {
            let inputs = t.shape.last().copied().unwrap_or(0);
            let blocks = WeightValues::blocks(format, inputs, bytes);
            return blocks.ok_or_else(|| LoadError::Gguf {
                path: path.clone(),
                error: GgufError::BadShape {
                    tensor: gguf::gguf_name(name),
                    reason: format!("{inputs} values per row are not whole blocks"),
                },
            });
        }
        if let Some(ty) = ggml {
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

/// The header of the GGUF file at `path`, the file as [`WeightsFiles`] keeps it, and the
/// bytes read.
pub(super) fn read_gguf(path: &Path) -> Result<(Gguf, WeightsFile, u64)> {
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
pub(super) fn read_text(path: &Path, limit: usize) -> Result<String> {
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
pub(super) fn single_file(dir: &Path) -> Result<String> {
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
pub(super) fn shard_names(weight_map: &[(String, String)]) -> Vec<String> {
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
pub(super) fn read_index(path: &Path) -> Result<Vec<(String, String)>> {
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
