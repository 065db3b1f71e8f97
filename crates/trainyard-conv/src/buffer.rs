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

/// One cache line of f32s, aligned to it.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([std::mem::MaybeUninit<f32>; 16]);

/// Scratch f32s that start on a cache line (64 bytes), so a vector load at a multiple of its width
/// never straddles two lines (a split load costs two). The allocator promises 16 bytes, at which every
/// other AVX2 load of a packed panel, and every AVX-512 one, could split; measured, the gain was within
/// this machine's noise, but it costs nothing.
pub struct Aligned {
    lines: Vec<Line>,
    len: usize,
}

impl Aligned {
    /// `len` f32s, to be written before they are read.
    pub fn uninit(len: usize) -> Aligned {
        let n = len.div_ceil(16);
        let mut lines = Vec::with_capacity(n);
        // SAFETY: `Line` holds `MaybeUninit`s only, which need no initialisation.
        unsafe { lines.set_len(n) };
        Aligned { lines, len }
    }

    /// The f32s, not yet written.
    pub fn as_uninit_mut(&mut self) -> &mut [std::mem::MaybeUninit<f32>] {
        // SAFETY: `lines` holds at least `len` contiguous `MaybeUninit<f32>`s.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast(), self.len) }
    }

    /// The first f32, for writing.
    pub fn as_mut_ptr(&mut self) -> *mut f32 {
        self.lines.as_mut_ptr().cast()
    }

    /// The first f32 (reading one is sound only once it was written).
    pub fn as_ptr(&self) -> *const f32 {
        self.lines.as_ptr().cast()
    }
}
