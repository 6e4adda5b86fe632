//! Buffers sized from numbers given at run time: element counts that fail instead of
//! overflowing, and allocations that fail instead of aborting.

use alloc::vec::Vec;

use crate::error::ShapeError;

/// Multiplies the dimensions of a shape, failing instead of overflowing.
pub(crate) fn element_count(dims: &[usize]) -> Result<usize, ShapeError> {
    dims.iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or(ShapeError::TooLarge)
}

/// The element count of a buffer of `T` whose axes have the sizes `dims`, given at run time:
/// [`ShapeError::Overflow`] naming `what` and the sizes when the count overflows `usize` or
/// the buffer would exceed `isize::MAX` bytes.
pub(crate) fn run_time_len<T>(what: &'static str, dims: &[usize]) -> Result<usize, ShapeError> {
    buffer_elements(dims, core::mem::size_of::<T>()).ok_or_else(|| ShapeError::Overflow {
        what,
        dims: dims.to_vec(),
    })
}

/// `len` copies of `value`, allocated fallibly: [`ShapeError::AllocationFailed`] naming `what`
/// when the memory cannot be had. `len` must come from [`run_time_len`].
pub(crate) fn try_filled<T: Clone>(
    what: &'static str,
    len: usize,
    value: T,
) -> Result<Vec<T>, ShapeError> {
    let mut buffer = Vec::new();
    try_grow(&mut buffer, len, value, what)?;
    Ok(buffer)
}

/// Makes `buffer` hold at least `len` values (new ones `value`), reserving fallibly:
/// [`ShapeError::Overflow`] naming `what` and `len` when `len` values would exceed
/// `isize::MAX` bytes, [`ShapeError::AllocationFailed`] when the memory cannot be had.
pub(crate) fn try_grow<T: Clone>(
    buffer: &mut Vec<T>,
    len: usize,
    value: T,
    what: &'static str,
) -> Result<(), ShapeError> {
    if buffer.len() < len {
        // More bytes than one allocation can hold: no such buffer exists.
        if len > (isize::MAX as usize) / core::mem::size_of::<T>().max(1) {
            return Err(ShapeError::Overflow {
                what,
                dims: alloc::vec![len],
            });
        }
        buffer
            .try_reserve_exact(len - buffer.len())
            .map_err(|_| ShapeError::AllocationFailed {
                what,
                bytes: len.saturating_mul(core::mem::size_of::<T>()),
            })?;
        buffer.resize(len, value);
    }
    Ok(())
}

/// The element count of a buffer of `size`-byte values whose axes have the sizes `dims`: the
/// product of `dims` (0 when any is 0), or `None` when it overflows `usize` or the buffer would
/// exceed `isize::MAX` bytes, the most any allocation can hold.
pub(crate) const fn buffer_elements(dims: &[usize], size: usize) -> Option<usize> {
    let mut i = 0;
    while i < dims.len() {
        if dims[i] == 0 {
            return Some(0);
        }
        i += 1;
    }
    let mut count: usize = 1;
    i = 0;
    while i < dims.len() {
        count = match count.checked_mul(dims[i]) {
            Some(count) => count,
            None => return None,
        };
        i += 1;
    }
    // Zero-sized values take no bytes: only the count limits them.
    let limit = match (isize::MAX as usize).checked_div(size) {
        Some(limit) => limit,
        None => usize::MAX,
    };
    if count <= limit {
        Some(count)
    } else {
        None
    }
}
