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

/// Whether `vdpbf16ps` does more multiply-adds a second than 512-bit FMAs on this core (each does 32 to an
/// FMA's 16): Zen 4 and 5 issue it as often as an FMA; Sapphire and Emerald Rapids at a quarter of the
/// FMA's rate, so there f32 FMAs over rounded operands (`Tier::Fma`) are the faster bf16. Timed once per
/// process, a few hundred microseconds: both loops with 16 independent accumulators, from registers.
pub fn dot_beats_fma() -> bool {
    static FASTER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FASTER.get_or_init(|| {
        if !available() {
            return false;
        }
        let best = |f: unsafe fn(usize) -> f32| {
            (0..3)
                .map(|_| {
                    let t = std::time::Instant::now();
                    // SAFETY: `available()`: the CPU has AVX512-BF16 and AVX-512F.
                    std::hint::black_box(unsafe { f(ROUNDS) });
                    t.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min)
        };
        let (dot, fma) = (best(dot_loop), best(fma_loop));
        // Multiply-adds a second: 32 per `vdpbf16ps`, 16 per FMA, the same count of each.
        32.0 / dot > 16.0 / fma
    })
}

/// Iterations of 16 instructions each loop times.
const ROUNDS: usize = 4096;

/// `rounds` × 16 independent `vdpbf16ps`.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn dot_loop(rounds: usize) -> f32 {
    let mut acc = [_mm512_setzero_ps(); 16];
    let a: __m512bh = std::mem::transmute(_mm512_set1_epi32(0x3f80_3f80));
    let b: __m512bh = std::mem::transmute(std::hint::black_box(_mm512_set1_epi32(0x3c00_3c00)));
    for _ in 0..rounds {
        for v in acc.iter_mut() {
            *v = _mm512_dpbf16_ps(*v, a, b);
        }
    }
    acc.iter().map(|v| _mm512_reduce_add_ps(*v)).sum()
}

/// `rounds` × 16 independent 512-bit FMAs.
#[target_feature(enable = "avx512f")]
unsafe fn fma_loop(rounds: usize) -> f32 {
    let mut acc = [_mm512_setzero_ps(); 16];
    let a = _mm512_set1_ps(1.0);
    let b = std::hint::black_box(_mm512_set1_ps(1e-3));
    for _ in 0..rounds {
        for v in acc.iter_mut() {
            *v = _mm512_fmadd_ps(a, b, *v);
        }
    }
    acc.iter().map(|v| _mm512_reduce_add_ps(*v)).sum()
}
