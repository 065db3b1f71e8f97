//! Matrix products with bf16 operands and f32 accumulation, `C [+]= bf16(A) · bf16(B)`: what PyTorch's CPU
//! autocast runs convolutions and linear layers as, on the CPU's own bf16 instructions. Tiers chosen at run
//! time (`Tier::detected`): AMX (`tdpbf16ps` on tile registers: Sapphire, Emerald and Granite Rapids) and AVX512-BF16
//! (`vdpbf16ps`: Cooper Lake, Zen 4 and 5); `Tier::Fma` is the same arithmetic as f32 FMAs over rounded
//! operands, for AVX-512 CPUs with no bf16 instruction faster than an FMA; `Tier::Portable` is it in plain
//! Rust, the reference the others are tested against.
//!
//! The operands are f32 matrices with any strides; packing rounds them to bf16 (round-to-nearest-even,
//! as autocast's casts do) into the tiles the instructions read (`pack`), once per call. Products of two
//! bf16s are exact in f32, so the tiers differ only in the order of the f32 sums.
//!
//! - `pack`: rounding and the tile layouts.
//! - `amx`, `avx512`: one 32 × 32 block of C per call, on each tier.
//! - `direct`: the convolution over channel-blocked activations on AMX, with no im2col matrix.

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
pub mod direct;
mod fma;
pub use fma::rounded;
pub mod pack;

use pack::{from_bf16, tiles, Strided, Tile, TILE_K, TILE_ROWS};
use rayon::prelude::*;

/// Which instructions a bf16 product runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// AMX-BF16 tiles.
    Amx,
    /// AVX512-BF16's `vdpbf16ps`.
    Avx512Bf16,
    /// AVX-512F's f32 FMAs over operands rounded to bf16 (`fma`): the same numbers where no bf16
    /// instruction outruns an FMA.
    Fma,
    /// Plain Rust (the reference; no speed).
    Portable,
}

impl Tier {
    /// Whether this CPU (and, for AMX, the kernel) runs the tier.
    pub fn supported(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Tier::Amx => amx::available(),
            #[cfg(target_arch = "x86_64")]
            Tier::Avx512Bf16 => avx512::available(),
            Tier::Fma => fma::available(),
            Tier::Portable => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The fastest tier this machine has: AMX; else `vdpbf16ps` where it multiplies and adds faster than
    /// FMAs do (Zen 4 and 5; not Sapphire/Emerald Rapids, whose AMX a VM may withhold); else f32 FMAs over
    /// rounded operands on AVX-512F. `None` (emulated) on a CPU without AVX-512F.
    pub fn detected() -> Option<Tier> {
        #[cfg(target_arch = "x86_64")]
        let fast_dot = avx512::dot_beats_fma;
        #[cfg(not(target_arch = "x86_64"))]
        let fast_dot = || false;
        [Tier::Amx, Tier::Avx512Bf16, Tier::Fma]
            .into_iter()
            .find(|t| t.supported() && (*t != Tier::Avx512Bf16 || fast_dot()))
    }

    /// The name the bench tables print and `parse` reads.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Amx => "amx",
            Tier::Avx512Bf16 => "avx512-bf16",
            Tier::Fma => "fma",
            Tier::Portable => "portable",
        }
    }

    pub fn parse(name: &str) -> Option<Tier> {
        [Tier::Amx, Tier::Avx512Bf16, Tier::Fma, Tier::Portable]
            .into_iter()
            .find(|t| t.name() == name)
    }
}

/// A convolution's input or output gradient as its producer left it. `Rounded`: every value is already a
/// bf16 (kept as f32), as autocast's bf16 ops store their results (a BatchNorm, a residual add, a
/// BatchNorm's backward); the `fma` tier then reads it in place where it would round a copy. The bf16
/// instructions' tiers round as they pack, either way. Rounding is idempotent, so `F32` is always right,
/// `Rounded` only faster; a `Rounded` whose values are not bf16s computes with unrounded operands.
#[derive(Debug, Clone, Copy)]
pub enum Values<'a> {
    /// Any f32 values: the tier rounds them.
    F32(&'a [f32]),
    /// bf16 values, each exactly representable: read as they are.
    Rounded(&'a [f32]),
}

impl<'a> Values<'a> {
    /// The values, rounded or not.
    pub fn slice(&self) -> &'a [f32] {
        match *self {
            Values::F32(v) | Values::Rounded(v) => v,
        }
    }

    /// The values as bf16s: borrowed when they are already, else a rounded copy.
    pub(crate) fn as_rounded(&self) -> std::borrow::Cow<'a, [f32]> {
        match *self {
            Values::F32(v) => std::borrow::Cow::Owned(fma::rounded(v)),
            Values::Rounded(v) => std::borrow::Cow::Borrowed(v),
        }
    }
}

/// `(m, n, k)`: C is m × n, the reduction k long.
pub type Dims = (usize, usize, usize);

/// An operand: an f32 matrix with (row, column) strides, or a function writing row i (all its values)
/// into a buffer, for a matrix that is cheaper to make row by row than to store (im2col's).
#[derive(Clone, Copy)]
pub enum Operand<'a> {
    Strided(&'a [f32], (usize, usize)),
    /// `Strided` whose every value is a bf16 already (kept as f32): its producer rounded as it stored, as
    /// autocast's bf16 ops do. The `fma` tier reads it in place where it would round a copy; the others
    /// round as they pack, either way. One whose values are not bf16s is computed with unrounded.
    Bf16(&'a [f32], (usize, usize)),
    Rows(&'a (dyn Fn(usize, &mut [f32]) + Sync)),
    /// A left operand packed once (`Packed::lhs`) for many products: a weight.
    Packed(&'a Packed),
}

/// How a product's sums reach C.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// C = the sums.
    Store,
    /// C += the sums.
    Accumulate,
    /// C = the sums rounded to bf16 (kept as f32): autocast's bf16 result, with no pass of its own.
    StoreBf16,
}

/// A left operand (m × k) rounded and packed, to be used by many products without packing it again.
pub struct Packed {
    tiles: Vec<Tile>,
    m: usize,
    k: usize,
}

impl Packed {
    /// `a` (m × k, with its (row, column) strides) packed.
    ///
    /// # Panics
    /// If the strides reach outside `a`.
    pub fn lhs(a: &[f32], (row, col): (usize, usize), (m, k): (usize, usize)) -> Packed {
        let a = Strided { data: a, row, col };
        assert!(a.covers(m, k), "bf16 operand out of bounds");
        let mut tiles = vec![Tile::ZERO; tiles(m, TILE_ROWS) * tiles(k, TILE_K)];
        pack::pack_a(a, m, k, &mut tiles);
        Packed { tiles, m, k }
    }

    /// The rounded values back as a contiguous m × k f32 matrix (`out`).
    fn unpack(&self, out: &mut [f32]) {
        let kt = tiles(self.k, TILE_K);
        for (t, tile) in self.tiles.iter().enumerate() {
            let (i0, k0) = ((t / kt) * TILE_ROWS, (t % kt) * TILE_K);
            let (rows, depth) = ((self.m - i0).min(TILE_ROWS), (self.k - k0).min(TILE_K));
            for r in 0..rows {
                for c in 0..depth {
                    out[(i0 + r) * self.k + k0 + c] = from_bf16(tile.0[r * TILE_K + c]);
                }
            }
        }
    }
}

/// `dst (m × n) [+]= bf16(lhs) (m × k) · bf16(rhs) (k × n)`, each matrix given with its (row, column)
/// strides in f32s; on all threads when `parallel`, else on this one.
///
/// # Panics
/// If `tier` is not supported, or an operand's strides reach outside its slice.
pub fn matmul(
    tier: Tier,
    dims: Dims,
    dst: (&mut [f32], (usize, usize)),
    accumulate: bool,
    lhs: (&[f32], (usize, usize)),
    rhs: (&[f32], (usize, usize)),
    parallel: bool,
) {
    let (a, b) = (
        Operand::Strided(lhs.0, lhs.1),
        Operand::Strided(rhs.0, rhs.1),
    );
    let write = if accumulate {
        Write::Accumulate
    } else {
        Write::Store
    };
    product(tier, dims, dst, write, (a, b), parallel)
}

/// `matmul` of operands either of which may be made row by row (`Operand::Rows`, packed on this thread).
///
/// # Panics
/// As `matmul`.
pub fn product(
    tier: Tier,
    (m, n, k): Dims,
    (dst, (dst_rs, dst_cs)): (&mut [f32], (usize, usize)),
    write: Write,
    (lhs, rhs): (Operand, Operand),
    parallel: bool,
) {
    check(tier, (m, n, k), (&lhs, &rhs));
    let covers_dst = m == 0 || n == 0 || (m - 1) * dst_rs + (n - 1) * dst_cs < dst.len();
    assert!(covers_dst, "bf16 matmul destination out of bounds");
    if m == 0 || n == 0 {
        return;
    }
    if tier == Tier::Fma {
        return fma::product((m, n, k), (dst, (dst_rs, dst_cs)), write, (lhs, rhs));
    }
    let (mt, nt, kt) = (tiles(m, TILE_ROWS), tiles(n, TILE_ROWS), tiles(k, TILE_K));
    let a_tiles = if matches!(lhs, Operand::Packed(_)) {
        0
    } else {
        mt * kt
    };
    with_packs(a_tiles, nt * kt, |pa, pb| {
        let pa: &[Tile] = match lhs {
            Operand::Strided(data, (row, col)) | Operand::Bf16(data, (row, col)) => {
                pack_a(Strided { data, row, col }, (m, k), pa, parallel);
                pa
            }
            Operand::Rows(f) => {
                pack::pack_a_rows(f, m, k, pa);
                pa
            }
            Operand::Packed(p) => &p.tiles,
        };
        match rhs {
            Operand::Strided(data, (row, col)) | Operand::Bf16(data, (row, col)) => {
                pack_b(Strided { data, row, col }, (k, n), pb, parallel)
            }
            Operand::Rows(f) => pack::pack_b_rows_of(f, k, n, pb),
            Operand::Packed(_) => unreachable!("refused above"),
        }
        let out = Out {
            ptr: dst.as_mut_ptr(),
            rs: dst_rs,
            cs: dst_cs,
            m,
            n,
            write,
        };
        let blocks = (mt.div_ceil(2), nt.div_ceil(2));
        let count = blocks.0 * blocks.1;
        let run = |range: std::ops::Range<usize>| {
            run_blocks(tier, (pa, mt), (pb, nt), kt, blocks.0, range, &out)
        };
        if parallel && count > 1 {
            let parts = rayon::current_num_threads().min(count);
            (0..parts)
                .into_par_iter()
                .for_each(|p| run(p * count / parts..(p + 1) * count / parts));
        } else {
            run(0..count);
        }
    });
}

/// bf16 autocast's `mm`, or with a `bias` its `addmm`: `bf16(bf16(lhs) · bf16(rhs) + bf16(bias))` as a
/// new contiguous m × n matrix, the bias added to the f32 sums, then one rounding. On the `fma` tier the
/// GEMM adds and rounds as it stores (nothing zeroed, no pass of its own); elsewhere a pass adds the bias.
///
/// # Panics
/// As `product`, and if `bias` does not hold n values.
pub fn rounded_product(
    tier: Tier,
    (m, n, k): Dims,
    (lhs, rhs): (Operand, Operand),
    bias: Option<&[f32]>,
    parallel: bool,
) -> Vec<f32> {
    check(tier, (m, n, k), (&lhs, &rhs));
    assert!(bias.is_none_or(|b| b.len() == n), "one bias per column");
    let bias: Option<Vec<f32>> = bias.map(|b| b.iter().map(|&v| round(v)).collect());
    if tier == Tier::Fma {
        return fma::product_new((m, n, k), (lhs, rhs), bias.as_deref(), true);
    }
    let mut c = vec![0f32; m * n];
    let dst = (&mut c[..], (n, 1));
    match &bias {
        None => product(tier, (m, n, k), dst, Write::StoreBf16, (lhs, rhs), parallel),
        Some(bias) => {
            product(tier, (m, n, k), dst, Write::Store, (lhs, rhs), parallel);
            c.par_chunks_mut(n.max(1)).for_each(|row| {
                for (v, b) in row.iter_mut().zip(bias) {
                    *v = round(*v + b);
                }
            });
        }
    }
    c
}

/// Panics unless `tier` runs here and the operands hold the (m × k) and (k × n) matrices.
fn check(tier: Tier, (m, n, k): Dims, (lhs, rhs): (&Operand, &Operand)) {
    assert!(
        tier.supported(),
        "bf16 tier {} is not supported here",
        tier.name()
    );
    let covers = |op: &Operand, rows, cols| match op {
        Operand::Strided(data, (row, col)) | Operand::Bf16(data, (row, col)) => Strided {
            data,
            row: *row,
            col: *col,
        }
        .covers(rows, cols),
        Operand::Rows(_) => true,
        Operand::Packed(p) => (p.m, p.k) == (rows, cols),
    };
    assert!(
        !matches!(rhs, Operand::Packed(_)),
        "a packed operand is a left one"
    );
    assert!(
        covers(lhs, m, k) && covers(rhs, k, n),
        "bf16 matmul operands out of bounds"
    );
}

/// A strided A into `pa`: one task per row tile (its kt tiles are a chunk) when `parallel`.
fn pack_a(a: Strided, (m, k): (usize, usize), pa: &mut [Tile], parallel: bool) {
    let kt = tiles(k, TILE_K);
    if parallel {
        pa.par_chunks_mut(kt).enumerate().for_each(|(i, t)| {
            let rows = (m - i * TILE_ROWS).min(TILE_ROWS);
            pack::pack_a(rows_of(a, i * TILE_ROWS), rows, k, t)
        });
    } else {
        pack::pack_a(a, m, k, pa);
    }
}

/// A strided B into `pb`, as `pack_a`.
fn pack_b(b: Strided, (k, n): (usize, usize), pb: &mut [Tile], parallel: bool) {
    let kt = tiles(k, TILE_K);
    if parallel {
        // Chunks of column tiles, so each task reads whole runs of B's rows.
        let per = tiles(n, TILE_ROWS)
            .div_ceil(4 * rayon::current_num_threads())
            .max(1);
        pb.par_chunks_mut(per * kt).enumerate().for_each(|(c, t)| {
            let j0 = c * per * TILE_ROWS;
            pack::pack_b(cols_of(b, j0), k, (n - j0).min(per * TILE_ROWS), t)
        });
    } else {
        pack::pack_b(b, k, n, pb);
    }
}

/// The rows of `a` from `first` on.
fn rows_of(a: Strided<'_>, first: usize) -> Strided<'_> {
    Strided {
        data: &a.data[first * a.row..],
        ..a
    }
}

/// The columns of `b` from `first` on.
fn cols_of(b: Strided<'_>, first: usize) -> Strided<'_> {
    Strided {
        data: &b.data[first * b.col..],
        ..b
    }
}

/// Where blocks of C go.
struct Out {
    ptr: *mut f32,
    rs: usize,
    cs: usize,
    m: usize,
    n: usize,
    write: Write,
}

// SAFETY: each block writes its own rows × columns of C (disjoint between blocks), inside the bounds
// `matmul` checked.
unsafe impl Sync for Out {}

impl Out {
    /// Block (bi, bj)'s 32 × 32 sums (row stride 32) into C, the part inside m × n.
    fn write(&self, (bi, bj): (usize, usize), sums: &[f32; 32 * 32]) {
        let (i0, j0) = (bi * 32, bj * 32);
        let cols = (self.n - j0).min(32);
        for r in 0..(self.m - i0).min(32) {
            let src = &sums[r * 32..][..cols];
            let first = (i0 + r) * self.rs + j0 * self.cs;
            if self.cs == 1 {
                // SAFETY: columns j0..j0 + cols of row i0 + r are inside m × n, whose every element
                // `matmul` checked lies in dst; they are contiguous (cs = 1); no other block writes them.
                let row = unsafe { std::slice::from_raw_parts_mut(self.ptr.add(first), cols) };
                match self.write {
                    Write::Store => row.copy_from_slice(src),
                    Write::Accumulate => row.iter_mut().zip(src).for_each(|(d, s)| *d += s),
                    Write::StoreBf16 => row.iter_mut().zip(src).for_each(|(d, s)| *d = round(*s)),
                }
                continue;
            }
            for (c, v) in src.iter().enumerate() {
                // SAFETY: as above, element by element.
                unsafe {
                    let p = self.ptr.add(first + c * self.cs);
                    *p = match self.write {
                        Write::Store => *v,
                        Write::Accumulate => *p + v,
                        Write::StoreBf16 => round(*v),
                    };
                }
            }
        }
    }
}

/// `v` rounded to the nearest bf16, as f32.
#[inline(always)]
pub fn round(v: f32) -> f32 {
    from_bf16(pack::to_bf16(v))
}

/// Blocks `range` (numbered row-major over `row_blocks` × ...) of C, on this thread.
fn run_blocks(
    tier: Tier,
    (pa, mt): (&[Tile], usize),
    (pb, nt): (&[Tile], usize),
    kt: usize,
    row_blocks: usize,
    range: std::ops::Range<usize>,
    out: &Out,
) {
    let mut sums = [0f32; 32 * 32];
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `matmul` checked the tier is supported.
    let session = (tier == Tier::Amx).then(|| unsafe { amx::Session::start() });
    for block in range {
        // Column blocks outer: consecutive blocks share B's panel.
        let (bj, bi) = (block / row_blocks, block % row_blocks);
        let (ti, tj) = (bi * 2, bj * 2);
        let a = (pa[ti * kt..].as_ptr(), kt, (mt - ti).min(2));
        let b = (pb[tj * kt..].as_ptr(), kt, (nt - tj).min(2));
        match tier {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: tiles ti (and ti + 1 when a.2 == 2) of A, tj (and tj + 1) of B each have kt
            // consecutive tiles in the packs.
            Tier::Amx => unsafe {
                session
                    .as_ref()
                    .expect("started")
                    .block(a, b, kt, &mut sums)
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above; the tier is supported.
            Tier::Avx512Bf16 => unsafe { avx512::block(a, b, kt, &mut sums) },
            _ => portable_block(a, b, kt, &mut sums),
        }
        out.write((bi, bj), &sums);
    }
}

/// The block in plain Rust: each sum in the order of k, pair by pair as `vdpbf16ps` adds them.
fn portable_block(
    (a, a_next, mt): (*const Tile, usize, usize),
    (b, b_next, nt): (*const Tile, usize, usize),
    kt: usize,
    out: &mut [f32; 32 * 32],
) {
    // SAFETY: the tiles as `run_blocks` promises them.
    let (a, b) = unsafe {
        (
            std::slice::from_raw_parts(a, (mt - 1) * a_next + kt),
            std::slice::from_raw_parts(b, (nt - 1) * b_next + kt),
        )
    };
    for r in 0..mt * TILE_ROWS {
        for c in 0..nt * TILE_ROWS {
            let mut s = 0f32;
            for t in 0..kt {
                let at = &a[(r / TILE_ROWS) * a_next + t].0[(r % TILE_ROWS) * TILE_K..][..TILE_K];
                let bt = &b[(c / TILE_ROWS) * b_next + t].0;
                for p in 0..TILE_K / 2 {
                    let bp = &bt[p * TILE_K + (c % TILE_ROWS) * 2..];
                    s += from_bf16(at[2 * p]) * from_bf16(bp[0])
                        + from_bf16(at[2 * p + 1]) * from_bf16(bp[1]);
                }
            }
            out[r * 32 + c] = s;
        }
    }
}

thread_local! {
    /// Each thread's packed operands, kept between calls (a product is called per image and layer).
    static PACKS: std::cell::RefCell<(Vec<Tile>, Vec<Tile>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// `f` on this thread's pack buffers grown to `a` and `b` tiles, or on fresh ones when they are in use
/// further up the stack.
fn with_packs<T>(a: usize, b: usize, f: impl FnOnce(&mut [Tile], &mut [Tile]) -> T) -> T {
    let fresh = || (vec![Tile::ZERO; a], vec![Tile::ZERO; b]);
    PACKS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut packs) => {
            let (pa, pb) = &mut *packs;
            if pa.len() < a {
                pa.resize(a, Tile::ZERO);
            }
            if pb.len() < b {
                pb.resize(b, Tile::ZERO);
            }
            f(&mut pa[..a], &mut pb[..b])
        }
        Err(_) => {
            let (mut pa, mut pb) = fresh();
            f(&mut pa, &mut pb)
        }
    })
}

#[cfg(test)]
mod tests;
