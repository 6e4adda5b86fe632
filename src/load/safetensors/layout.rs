//! [`Layout`]: where PyTorch and Hugging Face checkpoints keep the weights of one attention
//! layer, and [`MhaParams::from_safetensors`], which loads them into this crate's `x @ W`
//! convention.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

use super::SafeTensors;

/// How a checkpoint stores the weights of one multi-head attention layer.
///
/// In every formula below `x` is one token (a row of `D` features), `D` the model width,
/// `W[a:b]` rows `a..b` of a stored matrix, `W[:, a:b]` its columns `a..b`, and `{p}` the layer
/// prefix given to [`MhaParams::from_safetensors`](crate::MhaParams::from_safetensors). Shapes are as stored in the file. The
/// head split, the scaled dot-product softmax and the merge are the same in all of them (and in
/// this crate): heads are consecutive groups of `D / H` features of `q`, `k` and `v`.
///
/// The number of heads `H` is not stored in the weights: read it from the model's
/// configuration (`num_heads`, `num_attention_heads`, `n_head`) and pass it to
/// [`Mha::builder`](crate::Mha::builder).
///
/// | layout | tensors read | masking |
/// |---|---|---|
/// | [`PytorchMha`](Self::PytorchMha) | `{p}.in_proj_weight`, `{p}.in_proj_bias`, `{p}.out_proj.weight`, `{p}.out_proj.bias` | either |
/// | [`Bert`](Self::Bert) | `{p}.self.{query,key,value}.{weight,bias}`, `{p}.output.dense.{weight,bias}` | bidirectional |
/// | [`DistilBert`](Self::DistilBert) | `{p}.{q_lin,k_lin,v_lin,out_lin}.{weight,bias}` | bidirectional |
/// | [`Gpt2`](Self::Gpt2) | `{p}.c_attn.{weight,bias}`, `{p}.c_proj.{weight,bias}` | causal |
/// | [`Llama`](Self::Llama) | `{p}.{q,k,v,o}_proj.weight`, biases and `{p}.{q,k}_norm.weight` as the config says | causal |
/// | [`Phi3`](Self::Phi3) | `{p}.qkv_proj.weight`, `{p}.o_proj.weight` | causal |
/// | [`Phi`](Self::Phi) | `{p}.{q,k,v}_proj.{weight,bias}`, `{p}.dense.{weight,bias}` | causal |
/// | [`GptNeox`](Self::GptNeox) | `{p}.query_key_value.{weight,bias}`, `{p}.dense.{weight,bias}` | causal |
///
/// Every layout is read by one loader: a self-attention layer of width `D` by
/// [`MhaParams::from_safetensors`](crate::MhaParams::from_safetensors) with its head count,
/// any layer (grouped-query heads, `head_dim ≠ D / H`, QK-norm, sinks) by
/// [`LayerWeights::from_safetensors`](crate::LayerWeights::from_safetensors) with the model's
/// [`AttentionConfig`](crate::AttentionConfig), or by [`Checkpoint`](crate::Checkpoint).
///
/// ```
/// use mha::safetensors::Layout;
/// assert_eq!(
///     Layout::Gpt2.tensor_names("h.0.attn"),
///     ["h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias", "h.0.attn.c_proj.weight", "h.0.attn.c_proj.bias"]
/// );
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Layout {
    /// PyTorch's `torch.nn.MultiheadAttention(embed_dim=D, num_heads=H)`, saved from its
    /// `state_dict()` under the prefix `{p}` (e.g. `"layers.0.self_attn"` inside an
    /// `nn.TransformerEncoderLayer`, or `""` for the module alone). Weights are `(out, in)`,
    /// used as `y = x Wᵀ + b`:
    ///
    /// | tensor | shape |
    /// |---|---|
    /// | `{p}.in_proj_weight` | `(3D, D)` |
    /// | `{p}.in_proj_bias` | `(3D)` |
    /// | `{p}.out_proj.weight` | `(D, D)` |
    /// | `{p}.out_proj.bias` | `(D)` |
    ///
    /// ```text
    /// q = x · in_proj_weight[0:D]ᵀ   + in_proj_bias[0:D]      so  wq = in_proj_weight[0:D]ᵀ
    /// k = x · in_proj_weight[D:2D]ᵀ  + in_proj_bias[D:2D]         wk = in_proj_weight[D:2D]ᵀ
    /// v = x · in_proj_weight[2D:3D]ᵀ + in_proj_bias[2D:3D]        wv = in_proj_weight[2D:3D]ᵀ
    /// y = merged · out_proj.weightᵀ  + out_proj.bias              wo = out_proj.weightᵀ
    /// ```
    ///
    /// A module built with `bias=False` has neither bias; both are then `None`. Modules built
    /// with `add_bias_kv=True` (`{p}.bias_k`, `{p}.bias_v`) or with `kdim`/`vdim` different
    /// from `embed_dim` (`{p}.q_proj_weight`, … instead of `in_proj_weight`) are rejected with
    /// [`LoadError::UnexpectedTensor`](crate::LoadError::UnexpectedTensor). The masking is the caller's: causal for
    /// `is_causal=True` or a triangular `attn_mask`, bidirectional otherwise.
    PytorchMha,
    /// Hugging Face BERT-style self-attention (`BertAttention`, also RoBERTa, MiniLM and most
    /// sentence encoders), under a prefix such as `"encoder.layer.0.attention"` (or
    /// `"bert.encoder.layer.0.attention"`). Four `nn.Linear` layers, weights `(out, in)`:
    ///
    /// | tensor | shape |
    /// |---|---|
    /// | `{p}.self.query.weight`, `{p}.self.key.weight`, `{p}.self.value.weight` | `(D, D)` each |
    /// | `{p}.self.query.bias`, `{p}.self.key.bias`, `{p}.self.value.bias` | `(D)` each |
    /// | `{p}.output.dense.weight` | `(D, D)` |
    /// | `{p}.output.dense.bias` | `(D)` |
    ///
    /// ```text
    /// q = x · query.weightᵀ + query.bias        wq = query.weightᵀ   (k, v alike)
    /// y = merged · output.dense.weightᵀ + output.dense.bias          wo = output.dense.weightᵀ
    /// ```
    ///
    /// Attention is bidirectional ([`Masking::Bidirectional`](crate::Masking)), with padding
    /// given per call ([`AttendOptions::key_lengths`](crate::AttendOptions)). The layer's `y`
    /// is `BertSelfOutput`'s dense output: the residual connection and
    /// `{p}.output.LayerNorm` that follow it are not part of attention and are not applied.
    Bert,
    /// Hugging Face DistilBERT self-attention (`MultiHeadSelfAttention`), under a prefix such
    /// as `"transformer.layer.0.attention"`. Four `nn.Linear` layers, weights `(out, in)`:
    /// `{p}.q_lin`, `{p}.k_lin`, `{p}.v_lin`, `{p}.out_lin`, each with `.weight (D, D)` and
    /// `.bias (D)`:
    ///
    /// ```text
    /// q = x · q_lin.weightᵀ + q_lin.bias        wq = q_lin.weightᵀ   (k, v alike)
    /// y = merged · out_lin.weightᵀ + out_lin.bias                    wo = out_lin.weightᵀ
    /// ```
    ///
    /// Attention is bidirectional.
    DistilBert,
    /// Hugging Face GPT-2 (`GPT2Attention`), under a prefix such as `"h.0.attn"` (or
    /// `"transformer.h.0.attn"`). Its `Conv1D` layers store weights `(in, out)`, already in
    /// this crate's `x @ W` form, and the three input projections are fused side by side:
    ///
    /// | tensor | shape |
    /// |---|---|
    /// | `{p}.c_attn.weight` | `(D, 3D)` |
    /// | `{p}.c_attn.bias` | `(3D)` |
    /// | `{p}.c_proj.weight` | `(D, D)` |
    /// | `{p}.c_proj.bias` | `(D)` |
    ///
    /// ```text
    /// [q | k | v] = x · c_attn.weight + c_attn.bias
    ///   wq = c_attn.weight[:, 0:D]   wk = c_attn.weight[:, D:2D]   wv = c_attn.weight[:, 2D:3D]
    /// y = merged · c_proj.weight + c_proj.bias                      wo = c_proj.weight
    /// ```
    ///
    /// Attention is causal ([`Masking::Causal`](crate::Masking), the default). The
    /// `{p}.bias` / `{p}.masked_bias` buffers some checkpoints carry are the causal mask, not
    /// weights, and are not read.
    Gpt2,
    /// Hugging Face Llama-style attention (`LlamaAttention` and its descendants: Mistral,
    /// Qwen2, Qwen3, OLMo 2, Gemma 2/3, gpt-oss), under a prefix such as
    /// `"model.layers.0.self_attn"`. Four
    /// `nn.Linear` layers, weights `(out, in)`, for `H` query heads and `Hkv` key/value heads
    /// of `hd` features (read from `config.json`: [`AttentionConfig`](crate::AttentionConfig)):
    ///
    /// | tensor | shape | present |
    /// |---|---|---|
    /// | `{p}.q_proj.weight` | `(H·hd, D)` | always |
    /// | `{p}.k_proj.weight`, `{p}.v_proj.weight` | `(Hkv·hd, D)` each | always |
    /// | `{p}.o_proj.weight` | `(D, H·hd)` | always |
    /// | `{p}.{q,k,v,o}_proj.bias` | the output width | as the config says (Qwen2: q, k, v) |
    /// | `{p}.q_norm.weight`, `{p}.k_norm.weight` | `(hd)` each (Qwen3, Gemma 3), or `(H·hd)` and `(Hkv·hd)` (OLMo 2) | with QK-norm |
    /// | `{p}.sinks` | `(H)` | with attention sinks (gpt-oss) |
    ///
    /// ```text
    /// q = x · q_proj.weightᵀ (+ q_proj.bias)      wq = q_proj.weightᵀ   (k, v alike)
    /// y = merged · o_proj.weightᵀ (+ o_proj.bias)  wo = o_proj.weightᵀ
    /// ```
    ///
    /// Attention is causal. Loaded with
    /// [`LayerWeights::from_safetensors`](crate::LayerWeights::from_safetensors), which needs
    /// the head counts. Some families name tensors their own way, which the config's
    /// [`ModelType`](crate::ModelType) says: LFM2's output projection is `out_proj` and its
    /// norms `q_layernorm`, `k_layernorm`; Hunyuan's norms are `query_layernorm`,
    /// `key_layernorm`.
    Llama,
    /// Hugging Face Phi-3 (`Phi3Attention`), under a prefix such as
    /// `"model.layers.0.self_attn"`: the three input projections fused by rows, no biases.
    ///
    /// | tensor | shape |
    /// |---|---|
    /// | `{p}.qkv_proj.weight` | `((H + 2·Hkv)·hd, D)` |
    /// | `{p}.o_proj.weight` | `(D, H·hd)` |
    ///
    /// ```text
    /// [q | k | v] = x · qkv_proj.weightᵀ
    ///   wq = qkv_proj.weight[0 : H·hd]ᵀ   wk = qkv_proj.weight[H·hd : (H+Hkv)·hd]ᵀ
    ///   wv = qkv_proj.weight[(H+Hkv)·hd : (H+2·Hkv)·hd]ᵀ
    /// y = merged · o_proj.weightᵀ                                      wo = o_proj.weightᵀ
    /// ```
    ///
    /// Attention is causal; loaded with
    /// [`LayerWeights::from_safetensors`](crate::LayerWeights::from_safetensors).
    Phi3,
    /// Hugging Face Phi-1, Phi-1.5 and Phi-2 (`PhiAttention`), under a prefix such as
    /// `"model.layers.0.self_attn"`: four `nn.Linear` layers with biases, for `H` query heads
    /// and `Hkv` key/value heads of `hd` features.
    ///
    /// | tensor | shape |
    /// |---|---|
    /// | `{p}.q_proj.weight`, `{p}.q_proj.bias` | `(H·hd, D)`, `(H·hd)` |
    /// | `{p}.k_proj.weight`, `{p}.v_proj.weight` and biases | `(Hkv·hd, D)`, `(Hkv·hd)` each |
    /// | `{p}.dense.weight`, `{p}.dense.bias` | `(D, H·hd)`, `(D)` |
    ///
    /// ```text
    /// q = x · q_proj.weightᵀ + q_proj.bias      wq = q_proj.weightᵀ   (k, v alike)
    /// y = merged · dense.weightᵀ + dense.bias    wo = dense.weightᵀ
    /// ```
    ///
    /// Attention is causal, with partial rotary (`partial_rotary_factor`); loaded with
    /// [`LayerWeights::from_safetensors`](crate::LayerWeights::from_safetensors).
    Phi,
    /// Hugging Face GPT-NeoX and Pythia (`GPTNeoXAttention`), under a prefix such as
    /// `"gpt_neox.layers.0.attention"`, and BLOOM (`BloomAttention`, under
    /// `"transformer.h.0.self_attention"`): the input projections fused and interleaved per head,
    /// each head's query, key and value rows side by side (`H · hd = D`).
    ///
    /// | tensor | shape |
    /// |---|---|
    /// | `{p}.query_key_value.weight` | `(3D, D)` |
    /// | `{p}.query_key_value.bias` | `(3D)` (with `attention_bias`, the default) |
    /// | `{p}.dense.weight` | `(D, D)` |
    /// | `{p}.dense.bias` | `(D)` (with `attention_bias`) |
    ///
    /// ```text
    /// rows of query_key_value: [q_0, k_0, v_0, q_1, k_1, v_1, …], hd rows each
    ///   wq[:, h·hd + j] = query_key_value.weight[3h·hd + j]       (k: + hd, v: + 2·hd)
    /// y = merged · dense.weightᵀ + dense.bias                        wo = dense.weightᵀ
    /// ```
    ///
    /// Attention is causal; loaded with
    /// [`LayerWeights::from_safetensors`](crate::LayerWeights::from_safetensors).
    GptNeox,
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Layout::PytorchMha => "PyTorch nn.MultiheadAttention",
            Layout::Bert => "BERT attention",
            Layout::DistilBert => "DistilBERT attention",
            Layout::Gpt2 => "GPT-2 attention",
            Layout::Llama => "Llama attention",
            Layout::Phi3 => "Phi-3 attention",
            Layout::Phi => "Phi attention",
            Layout::GptNeox => "GPT-NeoX attention",
        })
    }
}

/// `{prefix}.{suffix}`, or `suffix` alone for an empty prefix.
pub(super) fn join(prefix: &str, suffix: &str) -> String {
    if prefix.is_empty() {
        String::from(suffix)
    } else {
        format!("{prefix}.{suffix}")
    }
}

impl Layout {
    /// The tensor-name suffixes this layout reads, in the order of
    /// [`tensor_names`](Self::tensor_names). The first one identifies a layer.
    fn suffixes(self) -> &'static [&'static str] {
        match self {
            Layout::PytorchMha => &[
                "in_proj_weight",
                "in_proj_bias",
                "out_proj.weight",
                "out_proj.bias",
            ],
            Layout::Bert => &[
                "self.query.weight",
                "self.query.bias",
                "self.key.weight",
                "self.key.bias",
                "self.value.weight",
                "self.value.bias",
                "output.dense.weight",
                "output.dense.bias",
            ],
            Layout::DistilBert => &[
                "q_lin.weight",
                "q_lin.bias",
                "k_lin.weight",
                "k_lin.bias",
                "v_lin.weight",
                "v_lin.bias",
                "out_lin.weight",
                "out_lin.bias",
            ],
            Layout::Gpt2 => &[
                "c_attn.weight",
                "c_attn.bias",
                "c_proj.weight",
                "c_proj.bias",
            ],
            Layout::Llama => &[
                "q_proj.weight",
                "k_proj.weight",
                "v_proj.weight",
                "o_proj.weight",
            ],
            Layout::Phi3 => &["qkv_proj.weight", "o_proj.weight"],
            Layout::Phi => &[
                "q_proj.weight",
                "k_proj.weight",
                "v_proj.weight",
                "dense.weight",
            ],
            Layout::GptNeox => &["query_key_value.weight", "dense.weight"],
        }
    }

    /// The full names of the tensors a layer at `prefix` is loaded from (a trailing `.` on
    /// the prefix is ignored; an empty prefix gives the bare names). For the
    /// [`Llama`](Self::Llama), [`Phi3`](Self::Phi3), [`Phi`](Self::Phi) and
    /// [`GptNeox`](Self::GptNeox) layouts,
    /// the weights always read; biases and QK-norm weights are read as the config says.
    pub fn tensor_names(self, prefix: &str) -> Vec<String> {
        let prefix = prefix.strip_suffix('.').unwrap_or(prefix);
        self.suffixes().iter().map(|s| join(prefix, s)).collect()
    }

    /// The prefixes of every layer of this layout in `st`, sorted by name: each prefix `p`
    /// for which the file holds this layout's first tensor (`p.in_proj_weight`,
    /// `p.self.query.weight`, `p.q_lin.weight`, `p.c_attn.weight`, `p.q_proj.weight`,
    /// `p.qkv_proj.weight` or `p.query_key_value.weight`).
    ///
    /// ```
    /// use mha::safetensors::{serialize, Layout, SafeTensors};
    /// let w = [0.0; 4];
    /// let bytes = serialize(&[("h.0.attn.c_attn.weight", &[2, 2], &w), ("h.1.attn.c_attn.weight", &[2, 2], &w)], &[])?;
    /// let st = SafeTensors::parse(&bytes)?;
    /// assert_eq!(Layout::Gpt2.prefixes_in(&st), ["h.0.attn", "h.1.attn"]);
    /// assert!(Layout::Bert.prefixes_in(&st).is_empty());
    /// # Ok::<(), mha::safetensors::SafeTensorsError>(())
    /// ```
    pub fn prefixes_in(self, st: &SafeTensors<'_>) -> Vec<String> {
        let anchor = self.suffixes()[0];
        st.names()
            .filter_map(|name| {
                if name == anchor {
                    return Some(String::new());
                }
                let prefix = name.strip_suffix(anchor)?.strip_suffix('.')?;
                Some(String::from(prefix))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    #[test]
    fn names_join_the_prefix() {
        assert_eq!(
            Layout::PytorchMha.tensor_names(""),
            vec![
                "in_proj_weight",
                "in_proj_bias",
                "out_proj.weight",
                "out_proj.bias"
            ]
        );
        assert_eq!(Layout::Bert.tensor_names("a.")[7], "a.output.dense.bias");
    }
}
