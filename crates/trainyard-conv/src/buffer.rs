//! Output buffers that are written completely before they are read: zeroing them first would cost a
//! pass over memory per op.

/// A buffer the caller fills completely before reading (zeroing it would cost a pass over memory).
pub fn uninit(len: usize) -> Vec<std::mem::MaybeUninit<f32>> {
    let mut v = Vec::with_capacity(len);
    // SAFETY: `MaybeUninit` needs no initialisation.
    unsafe { v.set_len(len) };
    v
}

/// # Safety
/// Every element of `v` has been written.
pub unsafe fn assume_init(v: Vec<std::mem::MaybeUninit<f32>>) -> Vec<f32> {
    let mut v = std::mem::ManuallyDrop::new(v);
    // SAFETY: same allocation, length and capacity; `MaybeUninit<f32>` has f32's layout; the caller
    // guarantees every element is initialised.
    unsafe { Vec::from_raw_parts(v.as_mut_ptr() as *mut f32, v.len(), v.capacity()) }
}
