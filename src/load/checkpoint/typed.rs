//! The typed front's loader: one self-attention layer of a safetensors buffer as
//! [`MhaParams`] and [`MhaBiases`], read by the same loader as every checkpoint.

use super::error::LoadError;
use super::sources::LayerSpec;
use super::weights::LayerWeights;
use crate::error::head_dim;
use crate::front::params::{MhaBiases, MhaParams};
use crate::front::tensor::Matrix;
use crate::kernels::WeightValues;
use crate::load::safetensors::{Layout, SafeTensors};

impl<const D: usize> MhaParams<D> {
    /// Loads the weights and biases of the self-attention layer with `n_heads` heads of width
    /// `D` stored under `prefix` in a checkpoint laid out as `layout`, converting them to this
    /// crate's `x @ W` convention (see [`Layout`] for each layout's tensor names, shapes and
    /// formulas), through the loader every layout and [`Checkpoint`](crate::Checkpoint) use.
    /// The head count places GPT-NeoX's per-head rows; grouped-query layers, QK-norm and
    /// sinks need the model's config: load those with
    /// [`LayerWeights::from_safetensors`](crate::LayerWeights::from_safetensors). Biases are
    /// read as the layout has them (BERT, DistilBERT, GPT-2: always; PyTorch: both or
    /// neither; the others: where the file holds them). `F32`, `F16` and
    /// `BF16` tensors are read, the 16-bit ones widened exactly; other tensors in the file
    /// are ignored. A trailing `.` on `prefix` is ignored.
    ///
    /// ```
    /// use mha::safetensors::{serialize, Layout, SafeTensors};
    /// use mha::{Masking, Mha, MhaParams, Tensor};
    /// // A BERT layer with D = 2 whose query projection swaps the two features.
    /// let (eye, swap, zero) = ([1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0], [0.0; 2]);
    /// let p = "encoder.layer.0.attention";
    /// let names = Layout::Bert.tensor_names(p); // query, key, value, output.dense: weight, bias
    /// let values: [&[f32]; 8] = [&swap, &zero, &eye, &zero, &eye, &zero, &eye, &[0.5, -0.5]];
    /// let tensors: Vec<(&str, &[usize], &[f32])> = names.iter().zip(values)
    ///     .map(|(n, v)| (n.as_str(), if v.len() == 4 { &[2, 2][..] } else { &[2][..] }, v))
    ///     .collect();
    /// let bytes = serialize(&tensors, &[])?;
    ///
    /// let st = SafeTensors::parse(&bytes)?;
    /// let (params, biases) = MhaParams::<2>::from_safetensors(&st, p, Layout::Bert, 1)?;
    /// assert_eq!(params.wq.as_slice(), &swap);
    /// assert_eq!(biases.bo.as_ref().unwrap().as_slice(), &[0.5, -0.5]);
    /// let mut layer = Mha::builder(&params, 1).masking(Masking::Bidirectional).biases(biases).build()?;
    /// let y = layer.forward(&Tensor::<1, 3, 2>::from_fn(|_, t, i| (t + i) as f32))?;
    ///
    /// // The wrong width, the wrong prefix: errors naming the tensor.
    /// let err = MhaParams::<4>::from_safetensors(&st, p, Layout::Bert, 1).unwrap_err();
    /// assert_eq!(err.to_string(), r#"tensor "encoder.layer.0.attention.self.query.weight" has shape [2, 2], expected [4, 4]"#);
    /// let err = MhaParams::<2>::from_safetensors(&st, "encoder.layer.1.attention", Layout::Bert, 1).unwrap_err();
    /// assert!(err.to_string().starts_with(r#"no tensor "encoder.layer.1.attention.self.query.weight""#));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// - [`LoadError::Typed`] when `n_heads` is 0 or does not divide `D`;
    /// - [`LoadError::MissingTensor`] naming the first missing tensor and the prefixes of the
    ///   layers of this layout the file does hold (a wrong prefix or layout);
    /// - [`LoadError::Shape`] naming the tensor, its shape in the file and the shape `D`
    ///   requires (a wrong `D`, a grouped-query layer, or a tensor of another layout);
    /// - [`LoadError::Dtype`] for a tensor stored as an integer or 8-bit type;
    /// - [`LoadError::UnexpectedTensor`] for a PyTorch module with `add_bias_kv` or separate
    ///   `kdim`/`vdim` projections, or QK-norm weights or sinks;
    /// - [`LoadError::AllocationFailed`] when a tensor's values do not fit in memory.
    ///
    /// A width whose `(D, D)` matrices could not exist in memory does not compile:
    ///
    /// ```compile_fail,E0080
    /// use mha::safetensors::{serialize, Layout, SafeTensors};
    /// let bytes = serialize(&[], &[]).unwrap();
    /// let st = SafeTensors::parse(&bytes).unwrap();
    /// let _ = mha::MhaParams::<{ 1 << 40 }>::from_safetensors(&st, "", Layout::Gpt2, 1);
    /// ```
    pub fn from_safetensors(
        st: &SafeTensors<'_>,
        prefix: &str,
        layout: Layout,
        n_heads: usize,
    ) -> Result<(Self, MhaBiases<D>), LoadError> {
        let typed = |error| LoadError::Typed { error };
        head_dim(D, n_heads).map_err(typed)?;
        let spec = LayerSpec::without_config(layout, D, n_heads);
        let w = LayerWeights::load_spec(st, prefix, &spec)?;
        let biases = MhaBiases::try_from(&w.biases).map_err(typed)?;
        let matrix =
            |values: WeightValues| Matrix::<D, D>::from_vec(values.into_f32()).map_err(typed);
        let params = MhaParams::new(matrix(w.wq)?, matrix(w.wk)?, matrix(w.wv)?, matrix(w.wo)?);
        Ok((params, biases))
    }
}
