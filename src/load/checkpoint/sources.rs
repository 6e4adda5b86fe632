//! Where each [`Layout`] keeps the four projections of one attention layer, and what a load
//! of one layer asks for ([`LayerSpec`]): the one description every layout is read through,
//! with or without a `config.json`.

use alloc::format;
use alloc::string::String;

use crate::load::config::{AttentionConfig, GateConfig, GateTensor, ModelType, QkNormConfig};
use crate::load::safetensors::Layout;

/// Which stored rows (output features) form a projection's output features: feature `c` is
/// row `(c / block) · stride + offset + c % block`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Rows {
    block: usize,
    stride: usize,
    offset: usize,
    /// The number of output features.
    pub width: usize,
}

impl Rows {
    /// `width` consecutive rows from `offset`.
    fn run(offset: usize, width: usize) -> Self {
        Rows {
            block: width.max(1),
            stride: 0,
            offset,
            width,
        }
    }

    /// The stored row of output feature `c`.
    pub(super) fn row(self, c: usize) -> usize {
        (c / self.block) * self.stride + self.offset + c % self.block
    }
}

/// How a weight tensor is stored: `nn.Linear`'s `(out, in)`, or GPT-2's `Conv1D`, `(in, out)`
/// (already `x @ W`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Orientation {
    OutIn,
    InOut,
}

/// Where a layout keeps one projection: the weight tensor `{name}{separator}weight` with
/// `outputs` output features in all (`inputs` input features), of which `take` are this
/// projection's, and its bias `{name}{separator}bias` (as long as the outputs, the same rows
/// taken); the separator is `.` but for PyTorch's `in_proj_weight`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Source {
    pub name: &'static str,
    pub separator: char,
    pub outputs: usize,
    pub inputs: usize,
    pub take: Rows,
    pub orientation: Orientation,
}

impl Source {
    /// The suffix of the weight tensor's name (after the layer prefix).
    pub(super) fn weight(&self) -> String {
        format!("{}{}weight", self.name, self.separator)
    }

    /// The suffix of the bias tensor's name.
    pub(super) fn bias(&self) -> String {
        format!("{}{}bias", self.name, self.separator)
    }

    /// The stored shape of the weight tensor.
    pub(super) fn shape(&self) -> [usize; 2] {
        match self.orientation {
            Orientation::OutIn => [self.outputs, self.inputs],
            Orientation::InOut => [self.inputs, self.outputs],
        }
    }
}

/// Whether a projection's bias is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Bias {
    /// The layer has none: a bias tensor in the file is an error (it would compute another
    /// model).
    Absent,
    /// The layer has one: a missing bias tensor is an error.
    Present,
    /// Read when the file holds it (a layout whose biases are optional, loaded without a
    /// config).
    IfStored,
    /// Read when the file holds it, as [`Bias::IfStored`], but the layer's `Paired` biases
    /// are stored all together or not at all (PyTorch's one `bias` flag covers
    /// `in_proj_bias` and `out_proj.bias`): one without the others is an error.
    Paired,
}

impl Bias {
    fn of(present: bool) -> Self {
        if present {
            Bias::Present
        } else {
            Bias::Absent
        }
    }
}

/// The names a [`Layout::Llama`] family gives its output projection and QK-norm weights.
#[derive(Clone, Copy, Debug)]
pub(super) struct LlamaNames {
    /// The output projection.
    pub output: &'static str,
    /// The query's and the key's norm.
    pub norms: [&'static str; 2],
}

impl LlamaNames {
    /// `o_proj`, `q_norm`, `k_norm`.
    const DEFAULT: LlamaNames = LlamaNames {
        output: "o_proj",
        norms: ["q_norm", "k_norm"],
    };

    /// The names of `model_type`'s checkpoints.
    fn of(model_type: ModelType) -> Self {
        match model_type {
            ModelType::Lfm2 => LlamaNames {
                output: "out_proj",
                norms: ["q_layernorm", "k_layernorm"],
            },
            ModelType::HunyuanDense => LlamaNames {
                norms: ["query_layernorm", "key_layernorm"],
                ..Self::DEFAULT
            },
            _ => Self::DEFAULT,
        }
    }
}

/// What one load of a layer reads: its layout and widths (`D`, `Q = n_heads · head_dim`,
/// `KV`, the values' `V` and the merged heads' `M`: `KV` and `Q` unless the value heads have a
/// width of their own), its biases (query, key, value, output), and whether it has a QK-norm or sinks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LayerSpec {
    pub layout: Layout,
    pub d: usize,
    pub q: usize,
    pub kv: usize,
    /// The value width `V = n_kv_heads · v_head_dim`.
    pub v: usize,
    /// The merged heads' width `M = n_heads · v_head_dim`: `o_proj`'s inputs.
    pub merged: usize,
    pub head_dim: usize,
    pub n_heads: usize,
    pub(super) biases: [Bias; 4],
    pub qk_norm: Option<QkNormConfig>,
    pub sinks: bool,
    /// The output gate, if any: in `q_proj`, per head the query rows and then as many gate
    /// rows (Qwen3.5, Qwen3-Next: `[q_h | gate_h]`, `2 · Q` rows in all), or in `g_proj`.
    pub gate: Option<GateConfig>,
    /// Whether the values are the key projection's output (Gemma 4's full layers with
    /// `attention_k_eq_v`): `k_proj` (and its bias) read as the value projection too, no
    /// `v_proj`.
    pub values_from_keys: bool,
    /// The names of the [`Layout::Llama`] output projection (`o_proj`; LFM2's `out_proj`)
    /// and of the query's and key's QK-norm (`q_norm`, `k_norm`; LFM2's `q_layernorm`,
    /// `k_layernorm`, Hunyuan's `query_layernorm`, `key_layernorm`), before `.weight`.
    pub(super) names: LlamaNames,
    /// A KV-shared layer ([`AttentionConfig::kv_source`]): no key or value projection (nor
    /// `k_norm`) is read.
    pub kv_shared: bool,
    /// Why a QK-norm tensor is refused when the layer has none.
    pub(super) no_norm: &'static str,
    /// Why a sinks tensor is refused when the layer has none.
    pub(super) no_sinks: &'static str,
}

impl LayerSpec {
    /// The layer `config` describes, whose widths `(Q, KV)` and value widths `(V, M)` it
    /// gave.
    pub(crate) fn of_config(
        config: &AttentionConfig,
        (q, kv): (usize, usize),
        (v, merged): (usize, usize),
    ) -> Self {
        let b = config.biases;
        let layout = config.layout();
        let fused = matches!(layout, Layout::Phi3 | Layout::GptNeox);
        let inputs = if fused { [b.q; 3] } else { [b.q, b.k, b.v] };
        let [bq, bk, bv] = inputs.map(Bias::of);
        let bv = if config.values_from_keys { bk } else { bv };
        LayerSpec {
            layout,
            d: config.hidden_size,
            q,
            kv,
            v,
            merged,
            head_dim: config.head_dim,
            n_heads: config.n_heads,
            biases: [bq, bk, bv, Bias::of(b.o)],
            qk_norm: config.qk_norm,
            sinks: config.sinks,
            gate: config.output_gate,
            values_from_keys: config.values_from_keys,
            names: LlamaNames::of(config.model_type),
            kv_shared: config.kv_source.is_some(),
            no_norm: "the config gives this layer no QK-norm",
            no_sinks: "the config gives this layer no attention sinks",
        }
    }

    /// A self-attention layer of width `d` with `n_heads` heads of `d / n_heads` (which the
    /// caller checked divides), loaded without a config: the biases the layout always has, or
    /// those the file holds; no QK-norm, no sinks.
    pub(crate) fn without_config(layout: Layout, d: usize, n_heads: usize) -> Self {
        let bias = match layout {
            Layout::Bert | Layout::DistilBert | Layout::Gpt2 => Bias::Present,
            Layout::PytorchMha => Bias::Paired,
            _ => Bias::IfStored,
        };
        LayerSpec {
            layout,
            d,
            q: d,
            kv: d,
            v: d,
            merged: d,
            head_dim: d / n_heads,
            n_heads,
            biases: [bias; 4],
            qk_norm: None,
            sinks: false,
            gate: None,
            values_from_keys: false,
            names: LlamaNames::DEFAULT,
            kv_shared: false,
            no_norm: "MhaParams holds no QK-norm (load this layer with LayerWeights)",
            no_sinks: "MhaParams holds no attention sinks (load this layer with LayerWeights)",
        }
    }

    /// The sources of the query, key, value and output projections.
    pub(super) fn sources(&self) -> [Source; 4] {
        let (d, q, kv, v) = (self.d, self.q, self.kv, self.v);
        let linear = |name, outputs, inputs| Source {
            name,
            separator: '.',
            outputs,
            inputs,
            take: Rows::run(0, outputs),
            orientation: Orientation::OutIn,
        };
        let named = |[q_name, k_name, v_name, o_name]: [&'static str; 4]| {
            [
                linear(q_name, q, d),
                linear(k_name, kv, d),
                linear(v_name, v, d),
                linear(o_name, d, self.merged),
            ]
        };
        let o_proj = self.names.output;
        match self.layout {
            Layout::Llama if self.gate_in_query() => {
                let [_, k, v, o] = named(["q_proj", "k_proj", "v_proj", o_proj]);
                [self.query_or_gate(0), k, v, o]
            }
            Layout::Llama if self.values_from_keys => named(["q_proj", "k_proj", "k_proj", o_proj]),
            Layout::PytorchMha | Layout::Phi3 | Layout::Gpt2 => self.fused_sources(),
            Layout::GptNeox => self.per_head_sources(),
            Layout::Bert => named(["self.query", "self.key", "self.value", "output.dense"]),
            Layout::DistilBert => named(["q_lin", "k_lin", "v_lin", "out_lin"]),
            Layout::Phi => named(["q_proj", "k_proj", "v_proj", "dense"]),
            Layout::Llama => named(["q_proj", "k_proj", "v_proj", o_proj]),
        }
    }

    /// Whether `q_proj` holds the output gate's rows after each head's query rows.
    fn gate_in_query(&self) -> bool {
        matches!(self.gate, Some(g) if g.tensor == GateTensor::InQuery)
    }

    /// The source of output gate `gate`'s weights: rows of `q_proj` or `g_proj`.
    pub(super) fn gate_source(&self, gate: GateConfig) -> Source {
        match gate.tensor {
            GateTensor::InQuery => self.query_or_gate(self.head_dim),
            GateTensor::Own => {
                let outputs = gate.width(self.q, self.n_heads);
                Source {
                    name: "g_proj",
                    separator: '.',
                    outputs,
                    inputs: self.d,
                    take: Rows::run(0, outputs),
                    orientation: Orientation::OutIn,
                }
            }
        }
    }

    /// The query (`offset` 0) or output gate (`offset` `head_dim`) rows of a `q_proj` that
    /// holds both, `[q_h | gate_h]` per head.
    pub(super) fn query_or_gate(&self, offset: usize) -> Source {
        Source {
            name: "q_proj",
            separator: '.',
            outputs: 2 * self.q,
            inputs: self.d,
            take: Rows {
                block: self.head_dim,
                stride: 2 * self.head_dim,
                offset,
                width: self.q,
            },
            orientation: Orientation::OutIn,
        }
    }

    /// Layouts whose query, key and value rows are consecutive runs of one fused tensor.
    fn fused_sources(&self) -> [Source; 4] {
        let (d, q, kv) = (self.d, self.q, self.kv);
        let ((name, separator), output, orientation) = match self.layout {
            Layout::PytorchMha => (("in_proj", '_'), "out_proj", Orientation::OutIn),
            Layout::Gpt2 => (("c_attn", '.'), "c_proj", Orientation::InOut),
            // Layout::Phi3.
            _ => (("qkv_proj", '.'), "o_proj", Orientation::OutIn),
        };
        let outputs = q + 2 * kv;
        let fused = |offset, width| Source {
            name,
            separator,
            outputs,
            inputs: d,
            take: Rows::run(offset, width),
            orientation,
        };
        let output = Source {
            name: output,
            separator: '.',
            outputs: d,
            inputs: q,
            take: Rows::run(0, d),
            orientation,
        };
        [fused(0, q), fused(q, kv), fused(q + kv, kv), output]
    }

    /// GPT-NeoX: one tensor whose rows are, per head, its query, key and value features.
    fn per_head_sources(&self) -> [Source; 4] {
        let (d, q, head_dim) = (self.d, self.q, self.head_dim);
        let per_head = |offset| Source {
            name: "query_key_value",
            separator: '.',
            outputs: 3 * q,
            inputs: d,
            take: Rows {
                block: head_dim,
                stride: 3 * head_dim,
                offset,
                width: q,
            },
            orientation: Orientation::OutIn,
        };
        let output = Source {
            name: "dense",
            separator: '.',
            outputs: d,
            inputs: q,
            take: Rows::run(0, d),
            orientation: Orientation::OutIn,
        };
        [
            per_head(0),
            per_head(head_dim),
            per_head(2 * head_dim),
            output,
        ]
    }
}
