//! The key/value store: `kv` (keys as `Kᵀ` panels, values as rows, rolling windows), `layout`
//! (the key block and a head's place in the store) and `side` (where a head's keys or values
//! sit in a side's elements, in its format: `format/`).

pub(crate) mod kv;
pub(crate) mod layout;
pub(crate) mod side;
