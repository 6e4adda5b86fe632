//! [`LayerWeights`]: one attention layer of a model family's checkpoint, read with the shapes
//! its [`AttentionConfig`] states, in this crate's `x @ W` convention, from any source of
//! tensors (a safetensors buffer in memory, or the files of a checkpoint directory).

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use super::error::LoadError;
use super::sources::{Bias, LayerSpec, Orientation, Rows, Source};
use crate::error::ShapeError;
use crate::kernels::{WeightBlocks, WeightFormat, WeightValues};
use crate::layer::gate::OutputGate;
use crate::layer::norm::{QkNorm, QkNormSpan};
use crate::layer::options::Masking;
use crate::layer::scores::{Alibi, AlibiPositions};
use crate::layer::{Biases, Layer, LayerBuilder, Projections, Widths};
use crate::load::config::{AttentionConfig, GateTensor, ProjectionScales};
use crate::load::safetensors::{decode_stored, Dtype, Layout, SafeTensors, SafeTensorsError};

type Result<T> = core::result::Result<T, LoadError>;

/// A tensor a [`TensorSource`] holds: its dtype and shape, and the file it is in.
pub(crate) struct Found<'a> {
    pub dtype: Dtype,
    pub shape: &'a [usize],
    /// The file, for messages (empty for a buffer in memory).
    pub file: &'a str,
}

/// Where the tensors of a layer come from: a parsed safetensors buffer, or the files of a
/// checkpoint directory (which reads a tensor's bytes only when asked for its values).
pub(crate) trait TensorSource {
    /// The tensor `name`, if any file holds it.
    fn find(&self, name: &str) -> Option<Found<'_>>;
    /// The values of the tensor `name` (which [`find`](Self::find) found, of a dtype that
    /// converts), in their stored format: `f32`, bf16 or f16 (the bits, not widened).
    fn stored(&self, name: &str) -> Result<WeightValues>;
    /// Every tensor name, for listing the layers a message could mean.
    fn names(&self) -> Vec<&str>;
    /// Where the tensors were looked for, for a missing tensor's message: the checkpoint
    /// directory and its weights files' names (both empty for a buffer in memory).
    fn searched(&self) -> (String, Vec<String>);
}

impl TensorSource for SafeTensors<'_> {
    fn find(&self, name: &str) -> Option<Found<'_>> {
        self.get(name).map(|t| Found {
            dtype: t.dtype(),
            shape: t.shape(),
            file: "",
        })
    }

    fn stored(&self, name: &str) -> Result<WeightValues> {
        let tensor = self.tensor(name);
        let values = tensor.and_then(|t| decode_stored(name, t.dtype(), t.data()));
        values.map_err(|e| match e {
            SafeTensorsError::AllocationFailed { bytes, .. } => LoadError::AllocationFailed {
                what: format!("the values of tensor \"{name}\""),
                bytes,
            },
            error => LoadError::File {
                path: String::new(),
                error,
            },
        })
    }

    fn names(&self) -> Vec<&str> {
        SafeTensors::names(self).collect()
    }

    fn searched(&self) -> (String, Vec<String>) {
        (String::new(), Vec::new())
    }
}

/// The weights of one attention layer, with shapes known at run time (`E = D`): matrices
/// row-major in the `x @ W` convention (rows are input features), as [`Projections`] takes
/// them, with the biases, QK-norm and sinks the config says the layer has.
///
/// Read from a checkpoint directory by [`Checkpoint::weights`](crate::Checkpoint::weights),
/// or from a safetensors buffer with [`from_safetensors`](Self::from_safetensors); made into a
/// layer with [`builder`](Self::builder).
#[derive(Clone, Debug, PartialEq)]
pub struct LayerWeights {
    /// The widths: `D = hidden_size`, `Q = n_heads · head_dim`, `KV = n_kv_heads · head_dim`,
    /// `V = n_kv_heads · v_head_dim`.
    pub widths: Widths,
    /// Query projection, `(D, Q)`, in its stored format.
    pub wq: WeightValues,
    /// Key projection, `(D, KV)`, in its stored format.
    pub wk: WeightValues,
    /// Value projection, `(D, KV)`, in its stored format.
    pub wv: WeightValues,
    /// Output projection, `(Q, D)`, in its stored format.
    pub wo: WeightValues,
    /// The biases the config gives the projections.
    pub biases: Biases,
    /// The QK-norm, with its weights from the checkpoint (plus the config's
    /// [`weight_offset`](crate::QkNormConfig::weight_offset)) and its span and epsilon from
    /// the config.
    pub qk_norm: Option<QkNorm>,
    /// The attention sinks' logits, one per query head (gpt-oss's `{prefix}.sinks`).
    pub sinks: Option<Vec<f32>>,
    /// The output gate (Qwen3.5, Qwen3-Next: the gate rows of `q_proj`, and of its bias).
    pub gate: Option<OutputGate>,
}

impl LayerWeights {
    /// Loads the attention layer stored under `prefix` (e.g.
    /// [`config.tensor_prefix()`](AttentionConfig::tensor_prefix)) in a safetensors buffer,
    /// in the layout of `config`'s family (see [`Layout::Llama`], [`Layout::Phi3`],
    /// [`Layout::Phi`] and [`Layout::GptNeox`] for the tensor names and formulas), checking every tensor's shape
    /// against the config and converting to `x @ W`. `F32`, `F16` and `BF16` tensors are read,
    /// the 16-bit ones widened exactly. Biases are read where [`AttentionConfig::biases`] says
    /// (for the fused layouts, one bias covers the query, key and value projections and is
    /// read when `biases.q` is set); QK-norm weights where [`AttentionConfig::qk_norm`] says,
    /// the sinks (`{prefix}.sinks`, `n_heads` logits) where [`AttentionConfig::sinks`] says.
    ///
    /// ```
    /// use mha::safetensors::{serialize, SafeTensors};
    /// use mha::{AttentionConfig, LayerWeights, Tensor};
    /// // A tiny Qwen2 layer: D = 4, 2 query heads and 1 key/value head of 2.
    /// let config = AttentionConfig::from_json(r#"{"model_type": "qwen2", "hidden_size": 4,
    ///     "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 1}"#, 0)?;
    /// let p = config.tensor_prefix();
    /// let name = |s: &str| format!("{p}.{s}");
    /// let (w4, w2, b4, b2) = ([0.5; 16], [0.25; 8], [0.1; 4], [0.2; 2]);
    /// let bytes = serialize(&[
    ///     (&name("q_proj.weight"), &[4, 4], &w4), (&name("q_proj.bias"), &[4], &b4),
    ///     (&name("k_proj.weight"), &[2, 4], &w2), (&name("k_proj.bias"), &[2], &b2),
    ///     (&name("v_proj.weight"), &[2, 4], &w2), (&name("v_proj.bias"), &[2], &b2),
    ///     (&name("o_proj.weight"), &[4, 4], &w4),
    /// ], &[])?;
    /// let st = SafeTensors::parse(&bytes)?;
    /// let weights = LayerWeights::from_safetensors(&st, &p, &config)?;
    /// assert_eq!((weights.widths.query, weights.widths.kv, weights.wk.len()), (4, 2, 8));
    /// assert_eq!(weights.biases.bk.as_deref(), Some(&[0.2, 0.2][..]));
    /// assert!(weights.biases.bo.is_none());
    ///
    /// let mut layer = weights.builder(&config)?.threads(1).build()?;
    /// let y = layer.forward(&Tensor::<1, 3, 4>::from_fn(|_, t, i| (t + i) as f32))?;
    /// assert!(y.iter().all(|v| v.is_finite()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// - [`LoadError::Config`] when `config` fails [`validate`](AttentionConfig::validate);
    /// - [`LoadError::MissingTensor`] naming the first missing tensor and the layers of this
    ///   family the buffer holds (read from a [`Checkpoint`](crate::Checkpoint), the directory
    ///   and its weights files too);
    /// - [`LoadError::Shape`] naming a tensor, its shape and the shape the config implies;
    /// - [`LoadError::UnexpectedTensor`] for a bias, QK-norm weight or sinks the config says
    ///   the layer does not have;
    /// - [`LoadError::Dtype`], [`LoadError::AllocationFailed`].
    pub fn from_safetensors(
        st: &SafeTensors<'_>,
        prefix: &str,
        config: &AttentionConfig,
    ) -> Result<Self> {
        Self::load(st, prefix, config, "")
    }

    /// Loads the layer under `prefix` from `source`, as
    /// [`from_safetensors`](Self::from_safetensors); `dir` is the directory `config.json` came
    /// from, for messages.
    pub(crate) fn load(
        source: &impl TensorSource,
        prefix: &str,
        config: &AttentionConfig,
        dir: &str,
    ) -> Result<Self> {
        let config_error = |error| LoadError::Config {
            dir: String::from(dir),
            error,
        };
        let widths = config.widths().map_err(config_error)?;
        let value_widths = config.value_widths().map_err(config_error)?;
        let spec = LayerSpec::of_config(config, widths, value_widths);
        let weights = Self::load_spec(source, prefix, &spec)?;
        Ok(weights.fold(config.projection_scales))
    }

    /// The layer with `scales` folded into its projections (see [`ProjectionScales`]):
    /// `Wq` times `input`, `Wk` times `input · key`, `Wv` times `input · value`, `bk` times
    /// `key`, `bv` times `value`, `Wo`, `bo` times `output`; a matrix whose factor is not 1
    /// becomes `f32`.
    fn fold(mut self, scales: ProjectionScales) -> Self {
        scale_matrix(&mut self.wq, scales.input);
        scale_matrix(&mut self.wk, scales.input * scales.key);
        scale_matrix(&mut self.wv, scales.input * scales.value);
        scale_matrix(&mut self.wo, scales.output);
        for (bias, factor) in [
            (&mut self.biases.bk, scales.key),
            (&mut self.biases.bv, scales.value),
            (&mut self.biases.bo, scales.output),
        ] {
            if let Some(bias) = bias.as_mut().filter(|_| factor != 1.0) {
                bias.iter_mut().for_each(|b| *b *= factor);
            }
        }
        self
    }

    /// Loads the layer `spec` describes under `prefix` from `source`: every layout, with or
    /// without a config, through the one [`Loader`].
    pub(crate) fn load_spec(
        source: &impl TensorSource,
        prefix: &str,
        spec: &LayerSpec,
    ) -> Result<Self> {
        let prefix = prefix.strip_suffix('.').unwrap_or(prefix);
        let l = Loader {
            source,
            prefix,
            layout: spec.layout,
        };
        l.refuse_unmodelled()?;
        let sources = spec.sources();
        let ([(wq, bq), (wk, bk), (wv, bv), (wo, bo)], gate) = l.gated_projections(spec)?;
        let read = [&bq, &bk, &bv, &bo].map(Option::is_some);
        let paired =
            |stored: bool| (0..4).find(|&i| spec.biases[i] == Bias::Paired && read[i] == stored);
        if let (Some(_), Some(missing)) = (paired(true), paired(false)) {
            return Err(l.missing(&sources[missing].bias()));
        }
        Ok(LayerWeights {
            widths: Widths::self_attention(spec.d, spec.kv, spec.q).with_value_width(spec.v),
            wq,
            wk,
            wv,
            wo,
            biases: Biases { bq, bk, bv, bo },
            qk_norm: l.qk_norm(spec)?,
            sinks: l.sinks(spec)?,
            gate,
        })
    }

    /// The format the four projection matrices are stored in when all of them are in one,
    /// else `F32`. [`builder`](Self::builder) gives the layer this format, or, when the
    /// formats differ (a GGUF `Q4_K_M` file's q4_K and q6_K), keeps each matrix in its own
    /// ([`LayerBuilder::stored_weight_formats`](crate::LayerBuilder::stored_weight_formats)),
    /// so the layer packs the checkpoint's values or blocks as they are and loses nothing.
    pub fn format(&self) -> WeightFormat {
        match self.has_one_format() {
            true => self
                .present()
                .next()
                .map_or(WeightFormat::F32, WeightValues::format),
            false => WeightFormat::F32,
        }
    }

    /// The projection matrices the layer has (a KV-shared layer's empty `wk` and `wv` do not
    /// count).
    fn present(&self) -> impl Iterator<Item = &WeightValues> {
        let matrices = [&self.wq, &self.wk, &self.wv, &self.wo];
        matrices.into_iter().filter(|m| !m.is_empty())
    }

    /// Whether the matrices the layer has are stored in one format.
    fn has_one_format(&self) -> bool {
        let mut formats = self.present().map(WeightValues::format);
        let first = formats.next();
        formats.all(|f| Some(f) == first)
    }

    /// The four projections, borrowed, for [`Layer::builder`].
    ///
    /// # Errors
    /// [`ShapeError::LengthMismatch`] when a matrix's length was changed after loading.
    pub fn projections(&self) -> core::result::Result<Projections<'_>, ShapeError> {
        Projections::from_values(self.widths, [&self.wq, &self.wk, &self.wv, &self.wo])
    }

    /// A builder of this layer as `config` describes it: causal, with the config's head count,
    /// these biases, the softmax scale, the rotary embedding, the QK-norm (before or after
    /// it), the value norm, the query scale, attention sinks, sliding window, chunked attention, soft cap and
    /// ALiBi; for a KV-shared layer ([`AttentionConfig::kv_source`], whose `wk` and `wv` are
    /// empty) a layer of [`Projections::queries_only`]. The thread count and instruction
    /// set are left to the builder. A windowed layer's
    /// [`new_cache`](crate::Layer::new_cache) is a rolling one.
    ///
    /// # Errors
    /// As [`projections`](Self::projections).
    pub fn builder(
        &self,
        config: &AttentionConfig,
    ) -> core::result::Result<LayerBuilder<'_>, ShapeError> {
        let projections = match config.kv_source {
            Some(_) => Projections::queries_only(self.widths, [&self.wq, &self.wo])?,
            None => self.projections()?,
        };
        let mut builder = Layer::builder(projections, config.n_heads)
            .masking(Masking::Causal)
            .biases(self.biases.clone())
            .scale(config.scale);
        builder = match self.has_one_format() {
            true => builder.weight_format(self.format()),
            false => builder.stored_weight_formats(),
        };
        if let Some(rope) = config.rope {
            builder = builder.rope(rope);
        }
        if let (Some(norm), Some(placement)) = (&self.qk_norm, config.qk_norm.map(|n| n.placement))
        {
            builder = builder.qk_norm(norm.clone()).qk_norm_placement(placement);
        }
        if let Some(eps) = config.value_norm {
            builder = builder.value_norm(eps);
        }
        if config.values_from_keys {
            builder = builder.values_from_keys();
        }
        if let Some(scale) = config.query_scale {
            builder = builder.query_scale(scale);
        }
        if let Some(chunk) = config.attention_chunk_size {
            builder = builder.chunked_attention(chunk);
        }
        if let Some(sinks) = &self.sinks {
            builder = builder.sinks(sinks.clone());
        }
        if let Some(gate) = &self.gate {
            builder = builder.output_gate(gate.clone());
        }
        if let Some(window) = config.sliding_window {
            builder = builder.sliding_window(window);
        }
        if let Some(cap) = config.softcap {
            builder = builder.softcap(cap);
        }
        if config.alibi {
            // BLOOM, the one family with ALiBi, places keys at their rank among real tokens.
            builder = builder
                .alibi(Alibi::Standard)
                .alibi_positions(AlibiPositions::RealTokens);
        }
        Ok(builder)
    }
}

/// `w` times `factor` (unchanged when it is 1), each product rounded once to `f32`.
fn scale_matrix(w: &mut WeightValues, factor: f32) {
    if factor != 1.0 {
        *w = WeightValues::F32(w.to_f32().iter().map(|x| x * factor).collect());
    }
}

/// The `x @ W` matrix `(inputs, take.width)` of `source`'s stored weights `w`, in their
/// format: element `(r, c)` is input `r` of stored output row `take.row(c)`; blocks (of an
/// `(out, in)` tensor) stay blocks, the rows taken.
fn to_x_at_w(w: &WeightValues, source: &Source, name: &str) -> Result<WeightValues> {
    Ok(match w {
        WeightValues::F32(w) => WeightValues::F32(x_at_w(w, source, name)?),
        WeightValues::Bf16(w) => WeightValues::Bf16(x_at_w(w, source, name)?),
        WeightValues::F16(w) => WeightValues::F16(x_at_w(w, source, name)?),
        WeightValues::Blocks(blocks) if source.orientation == Orientation::OutIn => {
            let row_bytes = blocks.bytes.len() / source.outputs.max(1);
            WeightValues::Blocks(WeightBlocks {
                bytes: taken_rows(&blocks.bytes, row_bytes, source, name)?,
                ..*blocks
            })
        }
        blocks => WeightValues::F32(x_at_w(&blocks.to_f32_as_stored(), source, name)?),
    })
}

/// The rows `source.take` of the `row_bytes`-byte rows `bytes`, in order.
fn taken_rows(bytes: &[u8], row_bytes: usize, source: &Source, name: &str) -> Result<Vec<u8>> {
    let take = source.take;
    let len = take.width.saturating_mul(row_bytes);
    let mut out = Vec::new();
    out.try_reserve_exact(len)
        .map_err(|_| LoadError::AllocationFailed {
            what: format!("the blocks of tensor \"{name}\""),
            bytes: len,
        })?;
    for c in 0..take.width {
        out.extend_from_slice(&bytes[take.row(c) * row_bytes..][..row_bytes]);
    }
    Ok(out)
}

/// [`to_x_at_w`] of values of one type. `(out, in)` tensors are transposed in square tiles
/// of [`TILE`], so that each tile's reads and writes stay in cache.
fn x_at_w<T: Copy + Default>(w: &[T], source: &Source, name: &str) -> Result<Vec<T>> {
    let (inputs, outputs, take) = (source.inputs, source.outputs, source.take);
    let len = inputs.saturating_mul(take.width);
    let mut out = Vec::new();
    out.try_reserve_exact(len)
        .map_err(|_| LoadError::AllocationFailed {
            what: format!("the values of tensor \"{name}\""),
            bytes: len.saturating_mul(size_of::<T>()),
        })?;
    let rows: Vec<usize> = (0..take.width).map(|c| take.row(c)).collect();
    match source.orientation {
        Orientation::InOut => {
            for r in 0..inputs {
                let stored = &w[r * outputs..][..outputs];
                out.extend(rows.iter().map(|&row| stored[row]));
            }
        }
        Orientation::OutIn => {
            out.resize(len, T::default());
            for (c0, tile_rows) in (0..).step_by(TILE).zip(rows.chunks(TILE)) {
                for r0 in (0..inputs).step_by(TILE) {
                    transpose_tile(w, inputs, tile_rows, r0, (&mut out, take.width, c0));
                }
            }
        }
    }
    Ok(out)
}

/// The side of the square tiles [`to_x_at_w`] transposes `(out, in)` tensors in.
const TILE: usize = 16;

/// Inputs `r0 .. r0 + TILE` (fewer at the end) of the stored rows `rows` of `w` (rows of
/// `inputs`), written transposed into columns `c0 ..` of `out` (rows of `width`): read row
/// by row into a local tile, then written row by row, so that every access is contiguous
/// (rows a power of two apart would otherwise contend for the same cache sets).
fn transpose_tile<T: Copy + Default>(
    w: &[T],
    inputs: usize,
    rows: &[usize],
    r0: usize,
    (out, width, c0): (&mut [T], usize, usize),
) {
    let n = TILE.min(inputs - r0);
    let mut tile = [[T::default(); TILE]; TILE];
    for (tile_row, &row) in tile.iter_mut().zip(rows) {
        tile_row[..n].copy_from_slice(&w[row * inputs + r0..][..n]);
    }
    for r in 0..n {
        let dst = &mut out[(r0 + r) * width + c0..][..rows.len()];
        for (x, tile_row) in dst.iter_mut().zip(&tile) {
            *x = tile_row[r];
        }
    }
}

/// The entries of a stored bias that belong to `rows`.
fn gather(b: &[f32], rows: Rows) -> Vec<f32> {
    (0..rows.width).map(|c| b[rows.row(c)]).collect()
}

const NO_BIAS: &str = "the config gives this projection no bias";

/// The reasons a PyTorch `nn.MultiheadAttention` is refused.
const BIAS_KV: &str =
    "add_bias_kv=True (a learned key and value appended to every sequence) is not modelled";
const SEPARATE_QKV: &str =
    "separate q/k/v projections (kdim or vdim differ from embed_dim) are not loaded, only in_proj_weight";

/// Reads the tensors of one layer of a family's layout from a source.
struct Loader<'s, S> {
    source: &'s S,
    prefix: &'s str,
    layout: Layout,
}

/// A projection's `x @ W` weights (in their stored format) and its bias.
type Projection = (WeightValues, Option<Vec<f32>>);

impl<S: TensorSource> Loader<'_, S> {
    /// `{prefix}.{suffix}`.
    fn name(&self, suffix: &str) -> String {
        if self.prefix.is_empty() {
            String::from(suffix)
        } else {
            format!("{}.{suffix}", self.prefix)
        }
    }

    /// The tensor `{prefix}.{suffix}`, checked to have `shape` and a dtype that converts; `None`
    /// when no file holds it. Its bytes are read only after the checks.
    fn optional(&self, suffix: &str, shape: &[usize]) -> Result<Option<WeightValues>> {
        let name = self.name(suffix);
        let Some(found) = self.source.find(&name) else {
            return Ok(None);
        };
        if found.shape != shape {
            return Err(LoadError::Shape {
                file: String::from(found.file),
                tensor: name,
                expected: shape.to_vec(),
                actual: found.shape.to_vec(),
            });
        }
        if !found.dtype.converts_to_f32() {
            return Err(LoadError::Dtype {
                file: String::from(found.file),
                tensor: name,
                dtype: found.dtype,
            });
        }
        self.source.stored(&name).map(Some)
    }

    /// The tensor `{prefix}.{suffix}` of `shape`, which the layer needs.
    fn required(&self, suffix: &str, shape: &[usize]) -> Result<WeightValues> {
        self.optional(suffix, shape)?
            .ok_or_else(|| self.missing(suffix))
    }

    /// The error for the missing tensor `{prefix}.{suffix}`, naming where it was looked for.
    fn missing(&self, suffix: &str) -> LoadError {
        let (dir, files) = self.source.searched();
        LoadError::MissingTensor {
            tensor: self.name(suffix),
            dir,
            files,
            layers: self.layers(),
        }
    }

    /// The prefixes of the layers of this layout the source holds (each prefix `p` for which
    /// it holds the layout's first tensor), sorted.
    fn layers(&self) -> Vec<String> {
        let anchor = self.layout.tensor_names("").swap_remove(0);
        let mut layers: Vec<String> = self
            .source
            .names()
            .into_iter()
            .filter_map(|name| match name.strip_suffix(anchor.as_str()) {
                Some("") => Some(String::new()),
                Some(prefix) => prefix.strip_suffix('.').map(String::from),
                None => None,
            })
            .collect();
        layers.sort_unstable();
        layers
    }

    /// The tensor `{prefix}.{suffix}` of `shape` when `present`; when not, checks that no file
    /// holds it.
    fn expected(
        &self,
        suffix: &str,
        shape: &[usize],
        present: bool,
        absent_reason: &'static str,
    ) -> Result<Option<WeightValues>> {
        if present {
            return self.required(suffix, shape).map(Some);
        }
        let name = self.name(suffix);
        match self.source.find(&name) {
            Some(found) => Err(LoadError::UnexpectedTensor {
                file: String::from(found.file),
                tensor: name,
                reason: absent_reason,
            }),
            None => Ok(None),
        }
    }

    /// `{prefix}.{suffix}` when `bias` says the layer has it or (`IfStored`) when stored.
    fn bias(&self, suffix: &str, len: usize, bias: Bias) -> Result<Option<Vec<f32>>> {
        let values = match bias {
            Bias::IfStored | Bias::Paired => self.optional(suffix, &[len]),
            _ => self.expected(suffix, &[len], bias == Bias::Present, NO_BIAS),
        };
        values.map(|values| values.map(WeightValues::into_f32))
    }

    /// The weights and bias of `source` as stored.
    fn stored(&self, source: &Source, bias: Bias) -> Result<Projection> {
        let w = self.required(&source.weight(), &source.shape())?;
        let b = self.bias(&source.bias(), source.outputs, bias)?;
        Ok((w, b))
    }

    /// The query, key, value and output projections and biases in `x @ W` of `spec`, and its
    /// output gate (read with the queries when `q_proj` holds it, the tensor read once; a
    /// `g_proj` has no bias).
    fn gated_projections(&self, spec: &LayerSpec) -> Result<([Projection; 4], Option<OutputGate>)> {
        let ([q, k, v, o], b) = (spec.sources(), spec.biases);
        let none = || (WeightValues::F32(Vec::new()), None);
        let Some(config) = spec.gate else {
            if spec.kv_shared {
                // A KV-shared layer: empty `wk` and `wv`, its keys and values are its source's.
                let [q, o] = self.projections(&[q, o], [b[0], b[3]])?;
                return Ok(([q, none(), none(), o], None));
            }
            return Ok((self.projections(&[q, k, v, o], b)?, None));
        };
        let gate_bias = match config.tensor {
            GateTensor::InQuery => b[0],
            GateTensor::Own => Bias::Absent,
        };
        let g = spec.gate_source(config);
        let (projections, (weight, bias)) = match spec.kv_shared {
            true => {
                let [q, g, o] = self.projections(&[q, g, o], [b[0], gate_bias, b[3]])?;
                ([q, none(), none(), o], g)
            }
            false => {
                let biases = [b[0], gate_bias, b[1], b[2], b[3]];
                let [q, g, k, v, o] = self.projections(&[q, g, k, v, o], biases)?;
                ([q, k, v, o], g)
            }
        };
        let gate = OutputGate {
            span: config.span,
            activation: config.activation,
            weight: weight.into_f32(),
            bias,
        };
        Ok((projections, Some(gate)))
    }

    /// The projections of `sources` and their biases in `x @ W`, each stored tensor read once
    /// (a fused tensor serves consecutive sources).
    fn projections<const N: usize>(
        &self,
        sources: &[Source; N],
        biases: [Bias; N],
    ) -> Result<[Projection; N]> {
        let mut stored: Option<(&str, Projection)> = None;
        let mut out: [Projection; N] = core::array::from_fn(|_| Default::default());
        for ((source, bias), slot) in sources.iter().zip(biases).zip(&mut out) {
            let (w, b) = match stored.take() {
                Some((name, read)) if name == source.name => read,
                _ => self.stored(source, bias)?,
            };
            let name = self.name(&source.weight());
            *slot = (
                to_x_at_w(&w, source, &name)?,
                b.as_ref().map(|b| gather(b, source.take)),
            );
            stored = Some((source.name, (w, b)));
        }
        Ok(out)
    }

    /// Refuses a PyTorch module whose extra tensors this crate does not model.
    fn refuse_unmodelled(&self) -> Result<()> {
        if self.layout != Layout::PytorchMha {
            return Ok(());
        }
        self.expected("bias_k", &[], false, BIAS_KV)?;
        self.expected("bias_v", &[], false, BIAS_KV)?;
        if self.source.find(&self.name("in_proj_weight")).is_none() {
            self.expected("q_proj_weight", &[], false, SEPARATE_QKV)?;
        }
        Ok(())
    }

    /// The QK-norm weights `{prefix}.q_norm.weight` and `{prefix}.k_norm.weight` (or the
    /// family's names for them; weights of 1 for a norm without them, Llama 4's).
    fn qk_norm(&self, spec: &LayerSpec) -> Result<Option<QkNorm>> {
        let (q_len, k_len) = match spec.qk_norm.map(|n| n.span) {
            Some(QkNormSpan::PerHead) => (spec.head_dim, spec.head_dim),
            Some(QkNormSpan::Whole) | None => (spec.q, spec.kv),
        };
        let learned = spec.qk_norm.is_some_and(|n| n.learned);
        let [q_name, k_name] = spec.names.norms.map(|n| format!("{n}.weight"));
        let q_weight = self.expected(&q_name, &[q_len], learned, spec.no_norm)?;
        // A KV-shared layer normalises no keys: its `k_norm` (if stored) is not read.
        let k_weight = match spec.kv_shared {
            true => None,
            false => self.expected(&k_name, &[k_len], learned, spec.no_norm)?,
        };
        let Some(norm) = spec.qk_norm else {
            return Ok(None);
        };
        let shift = |w: WeightValues| w.to_f32().iter().map(|x| x + norm.weight_offset).collect();
        let ones = |len| alloc::vec![1.0; len];
        Ok(Some(QkNorm {
            span: norm.span,
            q_weight: q_weight.map_or_else(|| ones(q_len), shift),
            k_weight: k_weight.map_or_else(|| ones(k_len), shift),
            eps: norm.eps,
        }))
    }

    /// The attention sinks `{prefix}.sinks`, one logit per query head.
    fn sinks(&self, spec: &LayerSpec) -> Result<Option<Vec<f32>>> {
        let sinks = self.expected("sinks", &[spec.n_heads], spec.sinks, spec.no_sinks)?;
        Ok(sinks.map(WeightValues::into_f32))
    }
}
