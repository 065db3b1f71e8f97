//! The vector registers the direct-convolution kernels are written over: AVX-512 (16 lanes, 32 registers),
//! AVX2+FMA (8 lanes, 16 registers) and a portable array of the same width. Every path multiplies and adds
//! with one rounding (a fused multiply-add; `f32::mul_add` on the portable path), so a kernel run on two
//! paths with the same lane count sums in the same order and gives bit-identical results.
//!
//! The methods are `#[inline(always)]` and carry no target features themselves: they are inlined into the
//! ISA entry points (`kernels.rs`), which enable the features, so the intrinsics compile to single
//! instructions there.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// One vector register of `LANES` f32s.
pub(super) trait Vector: Copy {
    const LANES: usize;
    /// All lanes zero.
    unsafe fn zero() -> Self;
    /// `LANES` values from `p` (unaligned).
    unsafe fn load(p: *const f32) -> Self;
    /// Writes the lanes to `p` (unaligned).
    unsafe fn store(self, p: *mut f32);
    /// `*p` in every lane.
    unsafe fn splat(p: *const f32) -> Self;
    /// `self + a * b`, one rounding.
    unsafe fn fma(self, a: Self, b: Self) -> Self;
    /// `self + a`.
    unsafe fn add(self, a: Self) -> Self;
    /// Each lane rounded to the nearest bf16 (kept as f32), as `bf16::pack::round_f32`: a branch-free
    /// loop over the lanes, which the compiler vectorises in the ISA entry points.
    #[inline(always)]
    unsafe fn round_bf16(self) -> Self {
        let mut lanes = [0f32; 16];
        self.store(lanes.as_mut_ptr());
        for v in &mut lanes[..Self::LANES] {
            *v = crate::bf16::pack::round_f32(*v);
        }
        Self::load(lanes.as_ptr())
    }
}

/// AVX-512F: a zmm register.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(super) struct Avx512(__m512);

#[cfg(target_arch = "x86_64")]
impl Vector for Avx512 {
    const LANES: usize = 16;
    #[inline(always)]
    unsafe fn zero() -> Self {
        Avx512(_mm512_setzero_ps())
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        Avx512(_mm512_loadu_ps(p))
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        _mm512_storeu_ps(p, self.0)
    }
    #[inline(always)]
    unsafe fn splat(p: *const f32) -> Self {
        Avx512(_mm512_set1_ps(*p))
    }
    #[inline(always)]
    unsafe fn fma(self, a: Self, b: Self) -> Self {
        Avx512(_mm512_fmadd_ps(a.0, b.0, self.0))
    }
    #[inline(always)]
    unsafe fn add(self, a: Self) -> Self {
        Avx512(_mm512_add_ps(self.0, a.0))
    }
    /// `round_f32`'s integer arithmetic on the 16 lanes at once (the default's loop over a stack array
    /// compiled to 256-bit halves with blends).
    #[inline(always)]
    unsafe fn round_bf16(self) -> Self {
        let bits = _mm512_castps_si512(self.0);
        let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(bits), _mm512_set1_epi32(1));
        let nearest = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
        let magnitude = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fff_ffff));
        let nan = _mm512_cmpgt_epi32_mask(magnitude, _mm512_set1_epi32(0x7f80_0000));
        let quiet = _mm512_or_si512(bits, _mm512_set1_epi32(0x0040_0000));
        let kept = _mm512_mask_blend_epi32(nan, nearest, quiet);
        let upper = _mm512_and_si512(kept, _mm512_set1_epi32(0xffff_0000_u32 as i32));
        Avx512(_mm512_castsi512_ps(upper))
    }
}

/// AVX2 with FMA: a ymm register.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(super) struct Avx2(__m256);

#[cfg(target_arch = "x86_64")]
impl Vector for Avx2 {
    const LANES: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> Self {
        Avx2(_mm256_setzero_ps())
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        Avx2(_mm256_loadu_ps(p))
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        _mm256_storeu_ps(p, self.0)
    }
    #[inline(always)]
    unsafe fn splat(p: *const f32) -> Self {
        Avx2(_mm256_set1_ps(*p))
    }
    #[inline(always)]
    unsafe fn fma(self, a: Self, b: Self) -> Self {
        Avx2(_mm256_fmadd_ps(a.0, b.0, self.0))
    }
    #[inline(always)]
    unsafe fn add(self, a: Self) -> Self {
        Avx2(_mm256_add_ps(self.0, a.0))
    }
}

/// Plain arrays: the reference every SIMD path is tested against, and the path for other CPUs.
#[derive(Clone, Copy)]
pub(super) struct Portable<const L: usize>([f32; L]);

impl<const L: usize> Vector for Portable<L> {
    const LANES: usize = L;
    #[inline(always)]
    unsafe fn zero() -> Self {
        Portable([0.0; L])
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        Portable(std::ptr::read_unaligned(p as *const [f32; L]))
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        std::ptr::write_unaligned(p as *mut [f32; L], self.0)
    }
    #[inline(always)]
    unsafe fn splat(p: *const f32) -> Self {
        Portable([*p; L])
    }
    #[inline(always)]
    unsafe fn fma(self, a: Self, b: Self) -> Self {
        let mut out = self.0;
        for ((o, x), y) in out.iter_mut().zip(a.0).zip(b.0) {
            *o = x.mul_add(y, *o);
        }
        Portable(out)
    }
    #[inline(always)]
    unsafe fn add(self, a: Self) -> Self {
        let mut out = self.0;
        for (o, x) in out.iter_mut().zip(a.0) {
            *o += x;
        }
        Portable(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each path's `round_bf16` is `round_f32` lane by lane: ties to even, carries into the exponent,
    /// infinities, NaNs kept quiet, signed zeros and subnormals.
    #[test]
    fn vector_rounding_is_round_f32() {
        let specials = [
            1.0f32 + 1.0 / 256.0,
            1.0 + 3.0 / 256.0,
            -(1.0 + 1.0 / 256.0),
            f32::from_bits(0x3f80_8000),
            f32::from_bits(0x3f81_8000),
            f32::from_bits(0x7f7f_ffff),
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::from_bits(0x7f80_0001),
            f32::from_bits(0xff80_0001),
            0.0,
            -0.0,
            f32::from_bits(0x0000_8000),
            f32::from_bits(0x8000_7fff),
            1.0 / 3.0,
        ];
        let mut values: Vec<f32> = specials.to_vec();
        let mut s = 0x9e37_79b9_u32;
        values.extend((0..64).map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            f32::from_bits(s)
        }));
        let want: Vec<u32> = values
            .iter()
            .map(|v| crate::bf16::pack::round_f32(*v).to_bits())
            .collect();
        fn each<V: Vector>(values: &[f32]) -> Vec<u32> {
            let mut out = values.to_vec();
            for c in out.chunks_exact_mut(V::LANES) {
                // SAFETY: `c` holds LANES values.
                unsafe { V::load(c.as_ptr()).round_bf16().store(c.as_mut_ptr()) };
            }
            out.iter().map(|v| v.to_bits()).collect()
        }
        assert_eq!(each::<Portable<16>>(&values), want);
        #[cfg(target_arch = "x86_64")]
        if crate::Isa::Avx512.supported() {
            #[target_feature(enable = "avx512f")]
            unsafe fn avx512(values: &[f32]) -> Vec<u32> {
                each::<Avx512>(values)
            }
            // SAFETY: the CPU has AVX-512F.
            assert_eq!(unsafe { avx512(&values) }, want);
        }
    }
}
