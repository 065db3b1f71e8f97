//! AVX512-BF16: `vdpbf16ps`, 16 f32 sums each gaining one bf16 pair product per instruction (twice an
//! FMA's multiply-adds), reading the same packed tiles as AMX: a B tile's row is one vector of 16 column
//! pairs, an A row's pair one broadcast. A block is computed 8 rows × up to 2 column tiles at a time (16
//! accumulators, 2 B vectors and a broadcast in registers).

use super::pack::{Tile, Windows, TILE_K, TILE_ROWS};
use std::arch::x86_64::*;

/// Whether this CPU has AVX512-BF16 (and AVX-512F, which it implies).
pub fn available() -> bool {
    is_x86_feature_detected!("avx512bf16") && is_x86_feature_detected!("avx512f")
}

/// Rows computed at once.
const MR: usize = 8;

/// `out` = the product, as `amx::Session::block`.
///
/// # Safety
/// `available()`, and the tiles as `amx::Session::block` needs them.
pub unsafe fn block(
    (a, a_next, mt): (*const Tile, usize, usize),
    (b, b_next, nt): (*const Tile, usize, usize),
    kt: usize,
    out: &mut [f32; 32 * 32],
) {
    for g in 0..mt * TILE_ROWS / MR {
        let a_rows = (a.wrapping_add((g / 2) * a_next), (g % 2) * MR);
        let c = &mut out[g * MR * 32..][..MR * 32];
        // SAFETY: the caller's promise, passed on.
        unsafe {
            if nt == 2 {
                rows::<2>(a_rows, (b, b_next), kt, c)
            } else {
                rows::<1>(a_rows, (b, b_next), kt, c)
            }
        }
    }
}

/// MR rows (from row `first` of the A tiles at `a`) × NT column tiles.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn rows<const NT: usize>(
    (a, first): (*const Tile, usize),
    (b, b_next): (*const Tile, usize),
    kt: usize,
    c: &mut [f32],
) {
    let mut acc = [[_mm512_setzero_ps(); NT]; MR];
    for t in 0..kt {
        // SAFETY: tile t of each operand exists (the caller's promise); rows and pairs stay in the tile.
        unsafe {
            let a_tile = (*a.add(t)).0.as_ptr().add(first * TILE_K) as *const i32;
            let b_tiles: [*const u16; NT] =
                std::array::from_fn(|j| (*b.add(j * b_next + t)).0.as_ptr());
            for p in 0..TILE_K / 2 {
                let bv: [__m512bh; NT] = std::array::from_fn(|j| {
                    std::mem::transmute(_mm512_loadu_si512(b_tiles[j].add(p * TILE_K) as *const _))
                });
                for r in 0..MR {
                    let pair = *a_tile.add(r * TILE_K / 2 + p);
                    let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair));
                    for j in 0..NT {
                        acc[r][j] = _mm512_dpbf16_ps(acc[r][j], av, bv[j]);
                    }
                }
            }
        }
    }
    for r in 0..MR {
        for j in 0..NT {
            // SAFETY: row r of `c` has 32 f32s; column tile j is 16 of them.
            unsafe { _mm512_storeu_ps(c.as_mut_ptr().add(r * 32 + j * 16), acc[r][j]) };
        }
    }
}

/// `out` = (or, with `accumulate`, +=) two A tiles times `nt` B tiles over the windows' steps, as
/// `amx::Session::windows_block`: the direct convolution's tiles read in place.
///
/// # Safety
/// `available()`, and the windows as `amx::Session::windows_block` needs them.
pub unsafe fn windows_block(
    a: &Windows,
    (b, nt): (&Windows, usize),
    accumulate: bool,
    out: &mut [f32; 32 * 32],
) {
    for g in 0..2 * TILE_ROWS / MR {
        let first = (g / 2) * a.next + (g % 2) * MR * a.row;
        let c = &mut out[g * MR * 32..][..MR * 32];
        // SAFETY: the caller's promise, passed on.
        unsafe {
            if nt == 2 {
                window_rows::<2>(a, first, b, accumulate, c)
            } else {
                window_rows::<1>(a, first, b, accumulate, c)
            }
        }
    }
}

/// MR rows (A rows at byte `first` past each step's A window, `a.row` apart) × NT column tiles.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn window_rows<const NT: usize>(
    a: &Windows,
    first: usize,
    b: &Windows,
    accumulate: bool,
    c: &mut [f32],
) {
    let mut acc = [[_mm512_setzero_ps(); NT]; MR];
    if accumulate {
        for (r, row) in acc.iter_mut().enumerate() {
            for (j, v) in row.iter_mut().enumerate() {
                // SAFETY: row r of `c` has 32 f32s; column tile j is 16 of them.
                *v = unsafe { _mm512_loadu_ps(c.as_ptr().add(r * 32 + j * 16)) };
            }
        }
    }
    for (&a_at, &b_at) in a.steps.iter().zip(b.steps) {
        // SAFETY: each window's rows lie in its allocation (the caller's promise).
        unsafe {
            let a_rows = a.base.add(a_at + first);
            let b_tiles: [*const u8; NT] = std::array::from_fn(|j| b.base.add(b_at + j * b.next));
            for p in 0..TILE_K / 2 {
                let bv: [__m512bh; NT] = std::array::from_fn(|j| {
                    std::mem::transmute(_mm512_loadu_si512(b_tiles[j].add(p * b.row) as *const _))
                });
                for (r, row) in acc.iter_mut().enumerate() {
                    let pair = (a_rows.add(r * a.row) as *const i32)
                        .add(p)
                        .read_unaligned();
                    let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair));
                    for (j, v) in row.iter_mut().enumerate() {
                        *v = _mm512_dpbf16_ps(*v, av, bv[j]);
                    }
                }
            }
        }
    }
    for (r, row) in acc.iter().enumerate() {
        for (j, v) in row.iter().enumerate() {
            // SAFETY: row r of `c` has 32 f32s; column tile j is 16 of them.
            unsafe { _mm512_storeu_ps(c.as_mut_ptr().add(r * 32 + j * 16), *v) };
        }
    }
}
