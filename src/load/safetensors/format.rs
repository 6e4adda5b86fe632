//! The fixed names and limits of the format, shared by the reader, the writer and the errors.

/// The largest header accepted, in bytes: 100 MB, the reference implementation's limit.
pub const MAX_HEADER_LEN: usize = 100_000_000;

/// The key of the optional string → string metadata object.
pub(crate) const METADATA_KEY: &str = "__metadata__";
