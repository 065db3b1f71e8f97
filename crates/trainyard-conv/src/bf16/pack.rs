//! Rounding f32 to bf16 and packing operands into the tiles both bf16 instructions read.
//!
//! A (m × k) is cut into tiles of 16 rows × 32 values of the reduction, each row 64 bytes: the A operand of
//! AMX's `tdpbf16ps`, and the rows `vdpbf16ps` broadcasts pairs from. B (k × n) is cut into tiles of 32
//! values of the reduction × 16 columns in "VNNI" order: row p of a tile holds, for each of its 16
//! columns, the pair (B[2p][j], B[2p+1][j]), so one 64-byte row is one `vdpbf16ps` vector and a whole tile
//! is AMX's B operand. Both are zero past m, n and k, so every tile is whole.

/// Rows of an A tile (and of a C tile), and columns of a B tile.
pub const TILE_ROWS: usize = 16;
/// Values of the reduction per tile: 64 bytes of bf16.
pub const TILE_K: usize = 32;

/// One tile: 16 rows of 64 bytes, on a cache line of its own.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct Tile(pub [u16; TILE_ROWS * TILE_K]);

impl Tile {
    pub const ZERO: Tile = Tile([0; TILE_ROWS * TILE_K]);
}

/// Round-to-nearest-even, as `vcvtne2ps2bf16`, PyTorch's autocast and Candle's cast round; a NaN stays a
/// (quiet) NaN.
#[inline(always)]
pub fn to_bf16(v: f32) -> u16 {
    let bits = v.to_bits();
    if v.is_nan() {
        ((bits >> 16) | 0x40) as u16
    } else {
        ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16
    }
}

/// The f32 a bf16 stands for (exact).
#[inline(always)]
pub fn from_bf16(v: u16) -> f32 {
    f32::from_bits((v as u32) << 16)
}

/// Tiles read in place: step t's first tile at `base + steps[t]` (bytes), its rows `row` bytes apart, its
/// second tile `next` bytes after the first.
pub struct Windows<'a> {
    pub base: *const u8,
    pub steps: &'a [usize],
    pub row: usize,
    pub next: usize,
}

/// A strided f32 matrix: element (i, j) at `data[i·row + j·col]`.
#[derive(Clone, Copy)]
pub struct Strided<'a> {
    pub data: &'a [f32],
    pub row: usize,
    pub col: usize,
}

impl Strided<'_> {
    /// Whether every element of a `rows` × `cols` matrix lies inside `data`.
    pub fn covers(&self, rows: usize, cols: usize) -> bool {
        rows == 0 || cols == 0 || (rows - 1) * self.row + (cols - 1) * self.col < self.data.len()
    }
}

/// How many tiles cover `len` values in steps of `step`.
pub fn tiles(len: usize, step: usize) -> usize {
    len.div_ceil(step)
}

/// `bits` of an f32 rounded to the nearest bf16 (ties to even) in its upper half; a NaN kept quiet. Integer
/// lane arithmetic, so the packing loops vectorise.
#[inline(always)]
fn rounded(bits: u32) -> u32 {
    let nan = (bits & 0x7fff_ffff) > 0x7f80_0000;
    let r = bits.wrapping_add(0x7fff + ((bits >> 16) & 1));
    if nan {
        bits | 0x0040_0000
    } else {
        r
    }
}

/// `dst[i]` = `src[i]` rounded to bf16 (as `to_bf16`), without branches, so the loop vectorises.
#[inline]
pub fn round_into(src: &[f32], dst: &mut [u16]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = (rounded(s.to_bits()) >> 16) as u16;
    }
}

/// `v` rounded to the nearest bf16 and back (as `from_bf16(to_bf16(v))`), without branches.
#[inline(always)]
pub fn round_f32(v: f32) -> f32 {
    f32::from_bits(rounded(v.to_bits()) & 0xffff_0000)
}

/// `dst[i]` = `round_f32(src[i])` over the shorter of the two: compiled for AVX-512F as well (the crate
/// builds for SSE2, whose four lanes made this loop a few percent of a bf16 step) and picked at run time.
pub fn round_to(src: &[f32], dst: &mut [std::mem::MaybeUninit<f32>]) {
    #[inline(always)]
    fn body(src: &[f32], dst: &mut [std::mem::MaybeUninit<f32>]) {
        for (d, s) in dst.iter_mut().zip(src) {
            d.write(round_f32(*s));
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512(src: &[f32], dst: &mut [std::mem::MaybeUninit<f32>]) {
        body(src, dst)
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F.
        return unsafe { avx512(src, dst) };
    }
    body(src, dst)
}

/// Each value of `v` rounded to bf16 in place, compiled as `round_to` is.
pub fn round_in_place(v: &mut [f32]) {
    #[inline(always)]
    fn body(v: &mut [f32]) {
        for x in v.iter_mut() {
            *x = round_f32(*x);
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512(v: &mut [f32]) {
        body(v)
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F.
        return unsafe { avx512(v) };
    }
    body(v)
}

/// One VNNI pair: `lo` and `hi` as bf16 in the low and high halves of a 32-bit word.
#[inline(always)]
fn pair(lo: f32, hi: f32) -> u32 {
    (rounded(hi.to_bits()) & 0xffff_0000) | (rounded(lo.to_bits()) >> 16)
}

/// `out[j] = pair(lo[j], hi[j])`: two rows of B into one row of a VNNI tile.
#[inline(always)]
pub(crate) fn pairs(lo: &[f32], hi: &[f32], out: &mut [u32]) {
    for ((o, l), h) in out.iter_mut().zip(lo).zip(hi) {
        *o = pair(*l, *h);
    }
}

/// `out[c] = pair(src[2c], src[2c + 1])`: consecutive values into pairs (`src` has 2 × `out` values).
#[inline(always)]
fn adjacent_pairs(src: &[f32], out: &mut [u32]) {
    for (o, two) in out.iter_mut().zip(src.chunks_exact(2)) {
        *o = pair(two[0], two[1]);
    }
}

impl Tile {
    /// The tile as 16 rows of 16 32-bit pairs.
    pub(crate) fn words(&mut self) -> &mut [u32; TILE_ROWS * TILE_K / 2] {
        // SAFETY: same size; the tile's 64-byte alignment is more than u32's; any bits are a valid u32.
        unsafe { &mut *(self.0.as_mut_ptr() as *mut [u32; TILE_ROWS * TILE_K / 2]) }
    }
}

/// A (m × k) as tiles `[m / 16][k / 32]`, rounded to bf16. `out` holds exactly that many tiles.
pub fn pack_a(a: Strided, m: usize, k: usize, out: &mut [Tile]) {
    let kt = tiles(k, TILE_K);
    debug_assert_eq!(out.len(), tiles(m, TILE_ROWS) * kt);
    for (t, tile) in out.iter_mut().enumerate() {
        let (i0, k0) = ((t / kt) * TILE_ROWS, (t % kt) * TILE_K);
        let (rows, depth) = ((m - i0).min(TILE_ROWS), (k - k0).min(TILE_K));
        if rows < TILE_ROWS || depth < TILE_K {
            *tile = Tile::ZERO;
        }
        for r in 0..rows {
            let src = (i0 + r) * a.row + k0 * a.col;
            if a.col == 1 {
                let words = &mut tile.words()[r * TILE_K / 2..][..depth / 2];
                adjacent_pairs(&a.data[src..src + depth / 2 * 2], words);
                if depth % 2 == 1 {
                    tile.0[r * TILE_K + depth - 1] = to_bf16(a.data[src + depth - 1]);
                }
            } else {
                for (c, d) in tile.0[r * TILE_K..][..depth].iter_mut().enumerate() {
                    *d = to_bf16(a.data[src + c * a.col]);
                }
            }
        }
    }
}

/// B (k × n) as tiles `[n / 16][k / 32]` in VNNI pairs, rounded to bf16. `out` holds exactly that many.
pub fn pack_b(b: Strided, k: usize, n: usize, out: &mut [Tile]) {
    let kt = tiles(k, TILE_K);
    debug_assert_eq!(out.len(), tiles(n, TILE_ROWS) * kt);
    for (t, tile) in out.iter_mut().enumerate() {
        let (cols, depth) = (
            (n - (t / kt) * TILE_ROWS).min(TILE_ROWS),
            (k - (t % kt) * TILE_K).min(TILE_K),
        );
        if cols < TILE_ROWS || depth < TILE_K {
            *tile = Tile::ZERO;
        }
    }
    if b.col == 1 {
        pack_b_rows(b, k, n, out)
    } else if b.row == 1 {
        pack_b_columns(b, k, n, out)
    } else {
        for (t, tile) in out.iter_mut().enumerate() {
            let (j0, k0) = ((t / kt) * TILE_ROWS, (t % kt) * TILE_K);
            let (cols, depth) = ((n - j0).min(TILE_ROWS), (k - k0).min(TILE_K));
            for kk in 0..depth {
                let src = (k0 + kk) * b.row + j0 * b.col;
                for j in 0..cols {
                    tile.0[(kk / 2) * TILE_K + j * 2 + kk % 2] = to_bf16(b.data[src + j * b.col]);
                }
            }
        }
    }
}

/// A (m × k) from `row(i, buf)`, which writes row i's k values: tiles as `pack_a` makes them, with no
/// f32 copy of A (an im2col matrix made row by row). `out` holds `[m / 16][k / 32]` tiles.
pub fn pack_a_rows(row: &(dyn Fn(usize, &mut [f32]) + Sync), m: usize, k: usize, out: &mut [Tile]) {
    let kt = tiles(k, TILE_K);
    if !k.is_multiple_of(TILE_K) {
        // The last tile of each row tile is only partly written below.
        out.iter_mut()
            .skip(kt - 1)
            .step_by(kt)
            .for_each(|t| *t = Tile::ZERO);
    }
    let mut buf = vec![0f32; k + 1];
    for i in 0..m {
        row(i, &mut buf[..k]);
        buf[k] = 0.0;
        for kb in 0..kt {
            let tile = &mut out[(i / TILE_ROWS) * kt + kb];
            let k0 = kb * TILE_K;
            let depth = (k - k0).min(TILE_K);
            let words = &mut tile.words()[(i % TILE_ROWS) * TILE_K / 2..][..depth.div_ceil(2)];
            adjacent_pairs(&buf[k0..k0 + depth.div_ceil(2) * 2], words);
        }
    }
    // Rows past m of the last row tile.
    for i in m..tiles(m, TILE_ROWS) * TILE_ROWS {
        for kb in 0..kt {
            out[(i / TILE_ROWS) * kt + kb].0[(i % TILE_ROWS) * TILE_K..][..TILE_K].fill(0);
        }
    }
}

/// B (k × n) from `row(kk, buf)`, which writes row kk's n values: tiles as `pack_b` makes them, two rows
/// of B at a time in a buffer instead of an f32 copy of B.
pub fn pack_b_rows_of(
    row: &(dyn Fn(usize, &mut [f32]) + Sync),
    k: usize,
    n: usize,
    out: &mut [Tile],
) {
    let kt = tiles(k, TILE_K);
    let mut buf = vec![0f32; 2 * n];
    for (t, tile) in out.iter_mut().enumerate() {
        let (cols, depth) = (
            (n - (t / kt) * TILE_ROWS).min(TILE_ROWS),
            (k - (t % kt) * TILE_K).min(TILE_K),
        );
        if cols < TILE_ROWS || depth < TILE_K {
            *tile = Tile::ZERO;
        }
    }
    for kk in (0..k).step_by(2) {
        let (lo, hi) = buf.split_at_mut(n);
        row(kk, lo);
        if kk + 1 < k {
            row(kk + 1, hi);
        } else {
            hi.fill(0.0);
        }
        let (kb, p) = (kk / TILE_K, (kk % TILE_K) / 2);
        for (jt, j0) in (0..n).step_by(TILE_ROWS).enumerate() {
            let cols = (n - j0).min(TILE_ROWS);
            let words = &mut out[jt * kt + kb].words()[p * TILE_ROWS..][..cols];
            pairs(&lo[j0..j0 + cols], &hi[j0..j0 + cols], words);
        }
    }
}

/// B with contiguous rows: each pair of rows read once, front to back, into one row of every tile.
fn pack_b_rows(b: Strided, k: usize, n: usize, out: &mut [Tile]) {
    let kt = tiles(k, TILE_K);
    let zeros = [0f32; TILE_ROWS];
    for kk in (0..k).step_by(2) {
        let lo = &b.data[kk * b.row..][..n];
        let hi = if kk + 1 < k {
            &b.data[(kk + 1) * b.row..][..n]
        } else {
            &zeros[..0]
        };
        let (kb, p) = (kk / TILE_K, (kk % TILE_K) / 2);
        for (jt, j0) in (0..n).step_by(TILE_ROWS).enumerate() {
            let cols = (n - j0).min(TILE_ROWS);
            let words = &mut out[jt * kt + kb].words()[p * TILE_ROWS..][..cols];
            if hi.is_empty() {
                pairs(&lo[j0..j0 + cols], &zeros[..cols], words);
            } else {
                pairs(&lo[j0..j0 + cols], &hi[j0..j0 + cols], words);
            }
        }
    }
}

/// B with contiguous columns (a transposed matrix): each column's pairs are adjacent values.
fn pack_b_columns(b: Strided, k: usize, n: usize, out: &mut [Tile]) {
    let kt = tiles(k, TILE_K);
    let mut column = [0u32; TILE_K / 2];
    for j in 0..n {
        let src = &b.data[j * b.col..][..k];
        for kb in 0..kt {
            let k0 = kb * TILE_K;
            let depth = (k - k0).min(TILE_K);
            adjacent_pairs(&src[k0..k0 + depth / 2 * 2], &mut column[..depth / 2]);
            if depth % 2 == 1 {
                column[depth / 2] = pair(src[k0 + depth - 1], 0.0);
            }
            let words = out[(j / TILE_ROWS) * kt + kb].words();
            for (p, w) in column[..depth.div_ceil(2)].iter().enumerate() {
                words[p * TILE_ROWS + j % TILE_ROWS] = *w;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_to_nearest_even() {
        // 1 + 2^-8 lies halfway between two bf16s: to the even one, 1.0; 1 + 3·2^-8 rounds up.
        assert_eq!(from_bf16(to_bf16(1.0 + 1.0 / 256.0)), 1.0);
        assert_eq!(from_bf16(to_bf16(1.0 + 3.0 / 256.0)), 1.0 + 4.0 / 256.0);
        assert_eq!(from_bf16(to_bf16(-2.5)), -2.5);
        assert!(from_bf16(to_bf16(f32::NAN)).is_nan());
        assert_eq!(from_bf16(to_bf16(f32::INFINITY)), f32::INFINITY);
        assert_eq!(from_bf16(to_bf16(f32::MAX)), f32::INFINITY);
    }

    #[test]
    fn packed_tiles_hold_each_value_where_the_instructions_read_it() {
        let (m, k, n) = (18, 35, 17);
        // Small integers: exact in bf16.
        let a: Vec<f32> = (0..m * k).map(|v| (v % 199) as f32).collect();
        let mut pa = vec![Tile::ZERO; tiles(m, 16) * tiles(k, 32)];
        // A given transposed (column-major) to exercise the strided read.
        let at: Vec<f32> = (0..m * k).map(|v| a[(v % m) * k + v / m]).collect();
        pack_a(
            Strided {
                data: &at,
                row: 1,
                col: m,
            },
            m,
            k,
            &mut pa,
        );
        for i in 0..m {
            for kk in 0..k {
                let tile = &pa[(i / 16) * 2 + kk / 32].0;
                assert_eq!(from_bf16(tile[(i % 16) * 32 + kk % 32]), a[i * k + kk]);
            }
        }
        assert_eq!(pa[3].0[2 * 32 + 3], 0, "past m and k: zero");
        let b: Vec<f32> = (0..k * n).map(|v| (v % 251) as f32).collect();
        for (row, col, data) in [(n, 1, b.clone()), (1, k, transpose(&b, k, n))] {
            let mut pb = vec![Tile::ZERO; tiles(n, 16) * tiles(k, 32)];
            pack_b(
                Strided {
                    data: &data,
                    row,
                    col,
                },
                k,
                n,
                &mut pb,
            );
            for kk in 0..k {
                for j in 0..n {
                    let tile = &pb[(j / 16) * 2 + kk / 32].0;
                    let at = ((kk % 32) / 2) * 32 + (j % 16) * 2 + kk % 2;
                    assert_eq!(from_bf16(tile[at]), b[kk * n + j], "k {kk} column {j}");
                }
            }
        }
    }

    fn transpose(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
        (0..rows * cols)
            .map(|t| v[(t % rows) * cols + t / rows])
            .collect()
    }
}
