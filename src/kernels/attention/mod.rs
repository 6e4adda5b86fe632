//! Attention over a key/value store in the FlashAttention-2 shape: the loop over key blocks
//! (`flash`), which keys a query sees (`mask`), the score terms (`terms`: soft cap, ALiBi,
//! sinks), the online softmax (`softmax`) and the attention weights out (`weights`).

pub(crate) mod flash;
pub(crate) mod mask;
pub(crate) mod softmax;
pub(crate) mod terms;
pub(crate) mod weights;
