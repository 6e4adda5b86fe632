//! What Step 3.5 (`step3p5`) sets per layer, as `Step3p7TextConfig` derives it: the query-head
//! count of its sliding layers.

use super::gemma4::per_layer;
use super::read::Obj;
use super::{at_least_one, Result};

/// Layer `layer`'s query heads (the model's `n_heads` unless overridden): its
/// `num_attention_heads` in `per_layer_config` when the config has that map (as
/// `save_pretrained` writes it), else on a sliding layer `num_sliding_attention_heads` or the
/// legacy `attention_other_setting.num_attention_heads`.
pub(super) fn heads(
    top: &Obj<'_, '_>,
    layer: usize,
    sliding: bool,
    n_heads: usize,
) -> Result<usize> {
    let read = "Step 3.5's per-layer setting read is num_attention_heads";
    if let Some([heads]) = per_layer(top, layer, ["num_attention_heads"], [n_heads], read)? {
        return Ok(heads);
    }
    if !sliding {
        return Ok(n_heads);
    }
    let key = "num_sliding_attention_heads";
    let given = match top.usize(key)? {
        Some(heads) => Some((top.key(key), heads)),
        None => match top.object("attention_other_setting")? {
            Some(other) => other
                .usize("num_attention_heads")?
                .map(|heads| (other.key("num_attention_heads"), heads)),
            None => None,
        },
    };
    match given {
        Some((key, 0)) => Err(at_least_one(&key)),
        Some((_, heads)) => Ok(heads),
        None => Ok(n_heads),
    }
}
