//! 2-D convolution for training on the CPU: im2col + the `gemm` crate, as a Candle custom op with its own
//! backward. Candle 0.11's conv backward computes the input gradient with a direct loop (3-10x slower than
//! PyTorch) and always computes it, even for the input images; here the input gradient is an im2col-shaped
//! GEMM followed by col2im, and is skipped when the input does not need one.
//!
//! Work is split over images (one rayon task per image, single-threaded GEMM inside), so results do not
//! depend on scheduling; the weight gradient sums fixed per-task partials in a fixed order, which keeps
//! runs bit-identical for a given thread count.

use crate::backend::candle::kernels::tape;
use candle_core::{CpuStorage, CustomOp2, DType, Device, Layout, Result, Shape, Tensor};
use gemm::Parallelism;
use rayon::prelude::*;
use trainyard_conv::bf16::{self, Operand, Tier, Write};

/// Square kernel, no dilation, one group: what the zoo uses.
#[derive(Debug, Clone, Copy)]
pub(super) struct Geometry {
    batch: usize,
    c_in: usize,
    h: usize,
    w: usize,
    c_out: usize,
    k: usize,
    stride: usize,
    padding: usize,
    /// Products with bf16 operands on this tier (`bf16-mixed` on a CPU with bf16 instructions); f32 when
    /// `None`.
    bf16: Option<Tier>,
}

impl Geometry {
    fn out_h(&self) -> usize {
        (self.h + 2 * self.padding - self.k) / self.stride + 1
    }
    fn out_w(&self) -> usize {
        (self.w + 2 * self.padding - self.k) / self.stride + 1
    }
    pub(super) fn out_hw(&self) -> usize {
        self.out_h() * self.out_w()
    }
    pub(super) fn c_out(&self) -> usize {
        self.c_out
    }
    pub(super) fn out_shape(&self) -> Shape {
        Shape::from((self.batch, self.c_out, self.out_h(), self.out_w()))
    }
    /// Rows of the im2col matrix: one per (input channel, kernel row, kernel column).
    fn ckk(&self) -> usize {
        self.c_in * self.k * self.k
    }
    /// Stride 1 with output as large as the input (odd kernel, padding k/2): im2col rows are shifted planes.
    fn keeps_width(&self) -> bool {
        self.stride == 1 && self.out_w() == self.w && self.out_h() == self.h
    }
    /// A 1x1, stride-1, unpadded conv reads the image itself as its im2col matrix.
    fn is_pointwise(&self) -> bool {
        self.k == 1 && self.stride == 1 && self.padding == 0
    }
}

/// `x` (N, C, H, W) convolved with `w` (O, C, K, K); falls back to Candle's own kernels off the CPU or
/// for other dtypes. (Under bf16 autocast: `autocast::Autocast::conv2d`.)
pub fn conv2d(x: &Tensor, w: &Tensor, stride: usize, padding: usize) -> Result<Tensor> {
    conv2d_on(x, w, stride, padding, None)
}

/// `conv2d`, or with `bf16` bf16 autocast's convolution on that tier: `x` and `w` rounded to bf16, f32
/// sums, the result rounded to bf16 (kept as f32); backward, the output gradient rounded, and both
/// gradients rounded as the casts around autocast's convolution round them. The roundings happen where
/// the products pack their operands and write their sums: no pass of their own.
pub fn conv2d_on(
    x: &Tensor,
    w: &Tensor,
    stride: usize,
    padding: usize,
    bf16: Option<Tier>,
) -> Result<Tensor> {
    if !handles(x, w)? {
        return x.conv2d(w, padding, stride, 1, 1);
    }
    tape::op2(
        &x.contiguous()?,
        &w.contiguous()?,
        Conv2d {
            stride,
            padding,
            bf16,
        },
    )
}

/// Whether `conv2d(x, w)` runs on the kernels here (CPU, f32, square kernel) rather than Candle's.
pub(crate) fn handles(x: &Tensor, w: &Tensor) -> Result<bool> {
    let (_, _, kh, kw) = w.dims4()?;
    Ok(matches!(x.device(), Device::Cpu)
        && x.dtype() == DType::F32
        && w.dtype() == DType::F32
        && kh == kw)
}

/// The geometry of `x` (N, C, H, W) convolved with `w` (O, C, K, K), checked.
pub(super) fn geometry(
    x: &Layout,
    w: &Layout,
    (stride, padding): (usize, usize),
    bf16: Option<Tier>,
) -> Result<Geometry> {
    let (batch, c_in, h, wd) = x.shape().dims4()?;
    let (c_out, wc, k, _) = w.shape().dims4()?;
    if wc != c_in {
        candle_core::bail!("conv2d: input has {c_in} channels, the kernel expects {wc}");
    }
    if h + 2 * padding < k || wd + 2 * padding < k {
        candle_core::bail!(
            "conv2d: a {h}x{wd} input (padding {padding}) is smaller than the {k}x{k} kernel"
        );
    }
    Ok(Geometry {
        batch,
        c_in,
        h,
        w: wd,
        c_out,
        k,
        stride,
        padding,
        bf16,
    })
}

use super::cpu::f32_slice as slice;

fn threads() -> usize {
    rayon::current_num_threads().max(1)
}

/// Fill the columns `offset..offset + out_hw` of `col` (ckk rows of `row_len`) from one image (c_in x h x w).
fn im2col(g: &Geometry, img: &[f32], col: &mut [f32], row_len: usize, offset: usize) {
    let ohw = g.out_hw();
    for row in 0..g.ckk() {
        im2col_row(g, img, row, &mut col[row * row_len + offset..][..ohw]);
    }
}

/// Row `row` (input channel, kernel row, kernel column) of one image's im2col matrix: `out_hw` values.
fn im2col_row(g: &Geometry, img: &[f32], row: usize, out: &mut [f32]) {
    let (oh, ow) = (g.out_h(), g.out_w());
    let (s, p) = (g.stride as isize, g.padding as isize);
    let (c, ki, kj) = (row / (g.k * g.k), (row / g.k) % g.k, row % g.k);
    let plane = &img[c * g.h * g.w..(c + 1) * g.h * g.w];
    if g.keeps_width() {
        shifted_copy(g, plane, out, ki, kj);
        return;
    }
    for y in 0..oh {
        let iy = y as isize * s - p + ki as isize;
        let dst = &mut out[y * ow..(y + 1) * ow];
        if iy < 0 || iy >= g.h as isize {
            dst.fill(0.0);
            continue;
        }
        let src = &plane[iy as usize * g.w..(iy as usize + 1) * g.w];
        let (lo, hi) = valid_range(ow, g.w, s, p, kj as isize);
        dst[..lo].fill(0.0);
        dst[hi.max(lo)..].fill(0.0);
        if hi > lo {
            let x0 = (lo as isize * s - p + kj as isize) as usize;
            if s == 1 {
                dst[lo..hi].copy_from_slice(&src[x0..x0 + (hi - lo)]);
            } else {
                for (i, d) in dst[lo..hi].iter_mut().enumerate() {
                    *d = src[x0 + i * g.stride];
                }
            }
        }
    }
}

/// Row `row` of the im2col matrix of `images` consecutive images (each `out_hw` columns), made on demand
/// for a bf16 product, which packs it without an f32 copy of the whole matrix.
fn im2col_rows<'a>(g: &'a Geometry, images: &'a [f32]) -> impl Fn(usize, &mut [f32]) + Sync + 'a {
    let (ohw, img_len) = (g.out_hw(), g.c_in * g.h * g.w);
    move |row, buf| {
        for (img, out) in images.chunks_exact(img_len).zip(buf.chunks_exact_mut(ohw)) {
            im2col_row(g, img, row, out);
        }
    }
}

/// A stride-1 conv whose output rows are as wide as the input's: the im2col row of tap (ki, kj) is the
/// plane shifted by (ki - p) rows and (kj - p) columns. Copied as one block, then the columns that wrapped
/// into the neighbouring row and the rows outside the image are zeroed: one memcpy per tap instead of
/// three calls per output row, which dominated for 4-32 pixel rows.
fn shifted_copy(g: &Geometry, plane: &[f32], out: &mut [f32], ki: usize, kj: usize) {
    let w = g.w;
    let (y0, y1) = tap_rows(g, ki);
    let (dy, dx) = (
        ki as isize - g.padding as isize,
        kj as isize - g.padding as isize,
    );
    out[..y0 * w].fill(0.0);
    out[y1 * w..].fill(0.0);
    if y1 > y0 {
        let (mut dst, mut src) = (y0 * w, (y0 as isize + dy) * w as isize + dx);
        let mut len = (y1 - y0) * w;
        if src < 0 {
            // Only the wrapped first column reaches before the plane; it is zeroed below.
            dst += src.unsigned_abs();
            len -= src.unsigned_abs();
            src = 0;
        }
        let src = src as usize;
        let len = len.min(plane.len() - src);
        out[dst..dst + len].copy_from_slice(&plane[src..src + len]);
        for y in y0..y1 {
            zero_wrapped_columns(&mut out[y * w..(y + 1) * w], dx);
        }
    }
}

/// Output rows `[y0, y1)` whose input row `y + ki - p` lies inside the image (stride 1).
fn tap_rows(g: &Geometry, ki: usize) -> (usize, usize) {
    let dy = ki as isize - g.padding as isize;
    let y0 = (-dy).clamp(0, g.h as isize) as usize;
    let y1 = (g.h as isize - dy).clamp(y0 as isize, g.h as isize) as usize;
    (y0, y1)
}

/// Zero the entries of one output row that a column shift of `dx` takes outside the input row.
fn zero_wrapped_columns(row: &mut [f32], dx: isize) {
    let w = row.len();
    let n = dx.unsigned_abs().min(w);
    // A 3x3 kernel shifts by one: a single store, not a call to memset.
    if n == 1 {
        let at = if dx > 0 { w - 1 } else { 0 };
        row[at] = 0.0;
        return;
    }
    if dx > 0 {
        row[w - n..].fill(0.0);
    } else {
        row[..n].fill(0.0);
    }
}

/// Write columns `offset..offset + out_hw` of `col` (ckk rows of `row_len`) back onto one image's gradient
/// (c_in x h x w), summing overlaps: the adjoint of `im2col`. `col` is scratch: the same-width stride-1
/// path zeroes its wrapped entries so that each tap adds as one contiguous block.
fn col2im(g: &Geometry, col: &mut [f32], row_len: usize, offset: usize, img: &mut [f32]) {
    if g.keeps_width() {
        return col2im_shifted(g, col, row_len, offset, img);
    }
    let (oh, ow) = (g.out_h(), g.out_w());
    let (s, p) = (g.stride as isize, g.padding as isize);
    img.fill(0.0);
    for c in 0..g.c_in {
        let plane = &mut img[c * g.h * g.w..(c + 1) * g.h * g.w];
        for ki in 0..g.k {
            for kj in 0..g.k {
                let row = (c * g.k + ki) * g.k + kj;
                let src_rows = &col[row * row_len + offset..][..oh * ow];
                let (lo, hi) = valid_range(ow, g.w, s, p, kj as isize);
                if hi <= lo {
                    continue;
                }
                let x0 = (lo as isize * s - p + kj as isize) as usize;
                for y in 0..oh {
                    let iy = y as isize * s - p + ki as isize;
                    if iy < 0 || iy >= g.h as isize {
                        continue;
                    }
                    let dst = &mut plane[iy as usize * g.w..(iy as usize + 1) * g.w];
                    let src = &src_rows[y * ow + lo..y * ow + hi];
                    if s == 1 {
                        for (d, v) in dst[x0..x0 + (hi - lo)].iter_mut().zip(src) {
                            *d += v;
                        }
                    } else {
                        for (i, v) in src.iter().enumerate() {
                            dst[x0 + i * g.stride] += v;
                        }
                    }
                }
            }
        }
    }
}

/// `col2im` for a stride-1 same-width conv: each tap's rows are added as one shifted block once its
/// wrapped columns are zeroed. Planes are cleared one at a time, while they are in cache.
fn col2im_shifted(g: &Geometry, col: &mut [f32], row_len: usize, offset: usize, img: &mut [f32]) {
    let (w, hw) = (g.w, g.h * g.w);
    for c in 0..g.c_in {
        let plane = &mut img[c * hw..(c + 1) * hw];
        plane.fill(0.0);
        for ki in 0..g.k {
            let (y0, y1) = tap_rows(g, ki);
            if y1 <= y0 {
                continue;
            }
            for kj in 0..g.k {
                let row = (c * g.k + ki) * g.k + kj;
                let taps = &mut col[row * row_len + offset..][..hw];
                let (dy, dx) = (
                    ki as isize - g.padding as isize,
                    kj as isize - g.padding as isize,
                );
                for y in y0..y1 {
                    zero_wrapped_columns(&mut taps[y * w..(y + 1) * w], dx);
                }
                let (mut from, mut to) = (y0 * w, (y0 as isize + dy) * w as isize + dx);
                let mut len = (y1 - y0) * w;
                if to < 0 {
                    // Only the wrapped first column reaches before the plane, and it is zero.
                    from += to.unsigned_abs();
                    len -= to.unsigned_abs();
                    to = 0;
                }
                let to = to as usize;
                let len = len.min(hw - to);
                for (d, v) in plane[to..to + len].iter_mut().zip(&taps[from..from + len]) {
                    *d += v;
                }
            }
        }
    }
}

/// Output columns `[lo, hi)` whose input column `x * s - p + kj` falls inside `0..w`.
fn valid_range(ow: usize, w: usize, s: isize, p: isize, kj: isize) -> (usize, usize) {
    // x * s - p + kj >= 0  <=>  x >= ceil((p - kj) / s)
    let lo = if p - kj > 0 {
        ((p - kj) + s - 1) / s
    } else {
        0
    };
    // x * s - p + kj <= w - 1  <=>  x <= floor((w - 1 + p - kj) / s)
    let top = w as isize - 1 + p - kj;
    let hi = if top < 0 { 0 } else { top / s + 1 };
    (
        lo.clamp(0, ow as isize) as usize,
        hi.clamp(0, ow as isize) as usize,
    )
}

/// dst (m x n, row-major) = [dst +] lhs (m x k) * rhs (k x n), with explicit strides.
#[allow(clippy::too_many_arguments)]
fn matmul(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    accumulate: bool,
    lhs: &[f32],
    lhs_strides: (usize, usize),
    rhs: &[f32],
    rhs_strides: (usize, usize),
    tk: Tasks,
) {
    let dst_strides = (n, 1);
    strided_matmul(
        (m, n, k),
        (dst, dst_strides),
        accumulate,
        (lhs, lhs_strides),
        (rhs, rhs_strides),
        tk,
    )
}

/// A GEMM over three strided matrices, each given with its (row, column) strides: in f32 on the `gemm`
/// crate, or with bf16 operands on the task's tier.
fn strided_matmul(
    (m, n, k): (usize, usize, usize),
    (dst, (dst_rs, dst_cs)): (&mut [f32], (usize, usize)),
    accumulate: bool,
    (lhs, (lhs_rs, lhs_cs)): (&[f32], (usize, usize)),
    (rhs, (rhs_rs, rhs_cs)): (&[f32], (usize, usize)),
    tk: Tasks,
) {
    if let Some(tier) = tk.bf16 {
        let parallel = !matches!(tk.par, Parallelism::None);
        return bf16::matmul(
            tier,
            (m, n, k),
            (dst, (dst_rs, dst_cs)),
            accumulate,
            (lhs, (lhs_rs, lhs_cs)),
            (rhs, (rhs_rs, rhs_cs)),
            parallel,
        );
    }
    let par = tk.par;
    let last = |rows: usize, cols: usize, rs: usize, cs: usize| (rows - 1) * rs + (cols - 1) * cs;
    assert!(
        m > 0
            && n > 0
            && k > 0
            && last(m, n, dst_rs, dst_cs) < dst.len()
            && last(m, k, lhs_rs, lhs_cs) < lhs.len()
            && last(k, n, rhs_rs, rhs_cs) < rhs.len(),
        "conv GEMM operands out of bounds"
    );
    // SAFETY: the assertion above: every index the kernel touches, (i * rs + j * cs) for i < rows and
    // j < cols, lies inside its slice.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            dst_cs as isize,
            dst_rs as isize,
            accumulate,
            lhs.as_ptr(),
            lhs_cs as isize,
            lhs_rs as isize,
            rhs.as_ptr(),
            rhs_cs as isize,
            rhs_rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            par,
        )
    }
}

/// How a batch is cut into tasks: consecutive images whose columns make one GEMM wide enough to run
/// near the kernel's peak (deep layers have few output pixels per image), while leaving a task per thread.
#[derive(Debug, Clone, Copy)]
struct Tasks {
    images: usize,
    par: Parallelism,
    bf16: Option<Tier>,
}

fn tasks(g: &Geometry) -> Tasks {
    let t = threads();
    if g.batch < t {
        // Too few images to keep every thread busy: images in turn, each GEMM multi-threaded.
        return Tasks {
            images: 1,
            par: Parallelism::Rayon(t),
            bf16: g.bf16,
        };
    }
    let wide = 512usize.div_ceil(g.out_hw()).max(1);
    Tasks {
        images: wide.min(g.batch.div_ceil(t)).max(1),
        par: Parallelism::None,
        bf16: g.bf16,
    }
}

/// Run `f(first_image, images, out_chunk, scratch)` over tasks, in parallel when `par` is single-threaded.
/// `scratch` holds at least the requested length of stale values: every task writes what it reads.
fn run_tasks<F>(tk: Tasks, batch: usize, out: &mut [f32], per_image: usize, scratch: usize, f: F)
where
    F: Fn(usize, usize, &mut [f32], &mut [f32]) + Sync + Send,
{
    let chunk = tk.images * per_image;
    if matches!(tk.par, Parallelism::None) {
        out.par_chunks_mut(chunk).enumerate().for_each(|(i, o)| {
            let first = i * tk.images;
            with_scratch(scratch, |buf| {
                f(first, tk.images.min(batch - first), o, buf)
            })
        });
    } else {
        with_scratch(scratch, |buf| {
            for (i, o) in out.chunks_mut(chunk).enumerate() {
                let first = i * tk.images;
                f(first, tk.images.min(batch - first), o, buf);
            }
        });
    }
}

thread_local! {
    /// Each thread's im2col buffer, kept between calls: a fresh zeroed one per task cost a full clear of
    /// up to a few MB per image (rayon may run a task per image).
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Run `f` on this thread's scratch buffer grown to `len` (its contents are stale), or on a fresh one
/// when the thread's buffer is in use further up the stack (a task stolen while waiting inside another).
fn with_scratch<T>(len: usize, f: impl FnOnce(&mut [f32]) -> T) -> T {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            if buf.len() < len {
                buf.resize(len, 0.0);
            }
            f(&mut buf[..len])
        }
        Err(_) => f(&mut vec![0f32; len]),
    })
}

/// Copy `images` consecutive (c x hw) planes side by side into a (c x images*hw) matrix.
fn gather_channels(src: &[f32], c: usize, hw: usize, images: usize, dst: &mut [f32]) {
    let cols = images * hw;
    for i in 0..images {
        for ch in 0..c {
            dst[ch * cols + i * hw..][..hw].copy_from_slice(&src[(i * c + ch) * hw..][..hw]);
        }
    }
}

/// The inverse of `gather_channels`.
fn scatter_channels(src: &[f32], c: usize, hw: usize, images: usize, dst: &mut [f32]) {
    let cols = images * hw;
    for i in 0..images {
        for ch in 0..c {
            dst[(i * c + ch) * hw..][..hw].copy_from_slice(&src[ch * cols + i * hw..][..hw]);
        }
    }
}

struct Conv2d {
    stride: usize,
    padding: usize,
    bf16: Option<Tier>,
}

impl CustomOp2 for Conv2d {
    fn name(&self) -> &'static str {
        "trainyard-conv2d"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let g = geometry(l1, l2, (self.stride, self.padding), self.bf16)?;
        let y = forward(&g, slice(s1, l1)?, slice(s2, l2)?, &|_, _| {});
        Ok((CpuStorage::F32(y), g.out_shape()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        backward(x, w, grad, (self.stride, self.padding), self.bf16)
    }
}

/// The forward kernel on checked geometry. `epilogue(first_image, out)` runs on each task's slice of the
/// output (whole images, `c_out` planes each) while it is still in cache: where fused ops add their
/// elementwise tail.
pub(super) fn forward(
    g: &Geometry,
    x: &[f32],
    w: &[f32],
    epilogue: &(dyn Fn(usize, &mut [f32]) + Sync),
) -> Vec<f32> {
    forward_rounding(g, x, w, true, epilogue)
}

/// `forward`, saying whether a bf16 convolution rounds its sums as it stores them (`round_store`): not
/// when the epilogue adds a bias first and rounds after it, as autocast's convolution with a bias does
/// (one bf16 op: `bf16(conv + bf16(b))`).
pub(super) fn forward_rounding(
    g: &Geometry,
    x: &[f32],
    w: &[f32],
    round_store: bool,
    epilogue: &(dyn Fn(usize, &mut [f32]) + Sync),
) -> Vec<f32> {
    let (ohw, ckk, img_len) = (g.out_hw(), g.ckk(), g.c_in * g.h * g.w);
    let tk = tasks(g);
    let mut y = vec![0f32; g.batch * g.c_out * ohw];
    let cols_max = tk.images * ohw;
    let direct = tk.images == 1;
    let scratch = ckk * cols_max + if direct { 0 } else { g.c_out * cols_max };
    // Under bf16, W packed once for every task.
    let packed = g
        .bf16
        .map(|_| bf16::Packed::lhs(w, (ckk, 1), (g.c_out, ckk)));
    run_tasks(
        tk,
        g.batch,
        &mut y,
        g.c_out * ohw,
        scratch,
        |first, images, y_out, buf| {
            let cols = images * ohw;
            let (col, tmp) = buf.split_at_mut(ckk * cols_max);
            if let (Some(tier), Some(packed)) = (tk.bf16, &packed) {
                let rows = im2col_rows(g, &x[first * img_len..(first + images) * img_len]);
                let dst = if direct {
                    &mut *y_out
                } else {
                    &mut tmp[..g.c_out * cols]
                };
                let operands = (Operand::Packed(packed), Operand::Rows(&rows));
                let parallel = !matches!(tk.par, Parallelism::None);
                let dims = (g.c_out, cols, ckk);
                bf16::product(
                    tier,
                    dims,
                    (dst, (cols, 1)),
                    if round_store {
                        Write::StoreBf16
                    } else {
                        Write::Store
                    },
                    operands,
                    parallel,
                );
                if !direct {
                    scatter_channels(&tmp[..g.c_out * cols], g.c_out, ohw, images, y_out);
                }
                epilogue(first, y_out);
                return;
            }
            let col: &[f32] = if direct && g.is_pointwise() {
                &x[first * img_len..(first + 1) * img_len]
            } else {
                for i in 0..images {
                    im2col(
                        g,
                        &x[(first + i) * img_len..][..img_len],
                        col,
                        cols,
                        i * ohw,
                    );
                }
                &col[..ckk * cols]
            };
            if direct {
                matmul(
                    g.c_out,
                    cols,
                    ckk,
                    y_out,
                    false,
                    w,
                    (ckk, 1),
                    col,
                    (cols, 1),
                    tk,
                );
            } else {
                matmul(
                    g.c_out,
                    cols,
                    ckk,
                    tmp,
                    false,
                    w,
                    (ckk, 1),
                    col,
                    (cols, 1),
                    tk,
                );
                scatter_channels(&tmp[..g.c_out * cols], g.c_out, ohw, images, y_out);
            }
            epilogue(first, y_out);
        },
    );
    y
}

mod backward;
pub(super) use backward::backward;
#[cfg(test)]
use backward::{InputGrad, WeightGrad};

#[cfg(test)]
#[allow(clippy::too_many_arguments)] // rstest cases: one argument per geometry field
mod tests;

#[cfg(test)]
mod timing;
