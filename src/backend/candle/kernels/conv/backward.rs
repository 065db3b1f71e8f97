//! The convolution's backward: the input gradient (col2im of `Wᵀ · dY`, or under bf16 a convolution of
//! its own) and the weight gradient (`dY · colᵀ` summed over fixed image ranges).

use super::*;

/// Gradients of the input (only when it is tracked: never for the images) and of the kernel, given the
/// gradient of the conv's output.
pub(crate) fn backward(
    x: &Tensor,
    w: &Tensor,
    grad: &Tensor,
    (stride, padding): (usize, usize),
    bf16: Option<Tier>,
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    let grad = grad.contiguous()?;
    let gx = if x.track_op() {
        let (_, _, h, wd) = x.dims4()?;
        Some(grad.apply_op2_no_bwd(
            w,
            &InputGrad {
                stride,
                padding,
                h,
                w: wd,
                bf16,
            },
        )?)
    } else {
        None
    };
    let gw = if w.track_op() {
        let (_, _, k, _) = w.dims4()?;
        Some(x.apply_op2_no_bwd(
            &grad,
            &WeightGrad {
                stride,
                padding,
                k,
                bf16,
            },
        )?)
    } else {
        None
    };
    Ok((gx, gw))
}

/// A stride-1 convolution whose output is as large as its input has as input gradient itself such a
/// convolution: of the output gradient, with the kernel's channels swapped and its taps flipped. Under
/// bf16 it runs as the forward pass does (im2col rows packed as they are made, no col2im).
fn input_grad_as_conv(g: &Geometry, gy: &[f32], w: &[f32]) -> Vec<f32> {
    let taps = g.k * g.k;
    let mut flipped = vec![0f32; w.len()];
    for o in 0..g.c_out {
        for c in 0..g.c_in {
            for t in 0..taps {
                flipped[(c * g.c_out + o) * taps + taps - 1 - t] = w[(o * g.c_in + c) * taps + t];
            }
        }
    }
    let transposed = Geometry {
        c_in: g.c_out,
        c_out: g.c_in,
        ..*g
    };
    forward(&transposed, gy, &flipped, &|_, _| {})
}

/// d(loss)/d(input) from (grad_out, weight).
pub(super) struct InputGrad {
    pub(super) stride: usize,
    pub(super) padding: usize,
    pub(super) h: usize,
    pub(super) w: usize,
    pub(super) bf16: Option<Tier>,
}

impl CustomOp2 for InputGrad {
    fn name(&self) -> &'static str {
        "trainyard-conv2d-input-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (batch, c_out, _, _) = l1.shape().dims4()?;
        let (wc_out, c_in, k, _) = l2.shape().dims4()?;
        if wc_out != c_out {
            candle_core::bail!(
                "conv2d backward: gradient has {c_out} channels, the kernel {wc_out}"
            );
        }
        let g = Geometry {
            batch,
            c_in,
            h: self.h,
            w: self.w,
            c_out,
            k,
            stride: self.stride,
            padding: self.padding,
            bf16: self.bf16,
        };
        let (gy, w) = (slice(s1, l1)?, slice(s2, l2)?);
        let shape = Shape::from((batch, c_in, self.h, self.w));
        if g.bf16.is_some() && g.keeps_width() {
            return Ok((CpuStorage::F32(input_grad_as_conv(&g, gy, w)), shape));
        }
        let (ohw, ckk, img_len) = (g.out_hw(), g.ckk(), g.c_in * g.h * g.w);
        let tk = tasks(&g);
        let cols_max = tk.images * ohw;
        let direct = tk.images == 1;
        // Under bf16, Wᵀ packed once for every task.
        let wt = g.bf16.map(|_| bf16::Packed::lhs(w, (1, ckk), (ckk, c_out)));
        let mut gx = vec![0f32; batch * img_len];
        let scratch = ckk * cols_max + if direct { 0 } else { c_out * cols_max };
        run_tasks(
            tk,
            batch,
            &mut gx,
            img_len,
            scratch,
            |first, images, gx_out, buf| {
                let cols = images * ohw;
                let (col, gathered) = buf.split_at_mut(ckk * cols_max);
                let gy_task = &gy[first * c_out * ohw..(first + images) * c_out * ohw];
                let rhs: &[f32] = if direct {
                    gy_task
                } else {
                    gather_channels(gy_task, c_out, ohw, images, gathered);
                    &gathered[..c_out * cols]
                };
                // col = W^T (ckk x c_out) * gy (c_out x cols)
                if let (Some(tier), Some(wt)) = (g.bf16, &wt) {
                    let pointwise = direct && g.is_pointwise();
                    let (dst, write) = if pointwise {
                        (&mut *gx_out, Write::StoreBf16)
                    } else {
                        (&mut col[..ckk * cols], Write::Store)
                    };
                    let operands = (Operand::Packed(wt), Operand::Strided(rhs, (cols, 1)));
                    let parallel = !matches!(tk.par, Parallelism::None);
                    bf16::product(
                        tier,
                        (ckk, cols, c_out),
                        (dst, (cols, 1)),
                        write,
                        operands,
                        parallel,
                    );
                    if pointwise {
                        return;
                    }
                } else if direct && g.is_pointwise() {
                    matmul(
                        ckk,
                        cols,
                        c_out,
                        gx_out,
                        false,
                        w,
                        (1, ckk),
                        rhs,
                        (cols, 1),
                        tk,
                    );
                    return;
                } else {
                    matmul(
                        ckk,
                        cols,
                        c_out,
                        col,
                        false,
                        w,
                        (1, ckk),
                        rhs,
                        (cols, 1),
                        tk,
                    );
                }
                for i in 0..images {
                    col2im(
                        &g,
                        col,
                        cols,
                        i * ohw,
                        &mut gx_out[i * img_len..(i + 1) * img_len],
                    );
                }
                if g.bf16.is_some() {
                    gx_out.iter_mut().for_each(|v| *v = bf16::round(*v));
                }
            },
        );
        Ok((CpuStorage::F32(gx), shape))
    }
}

/// d(loss)/d(weight) from (input, grad_out).
pub(super) struct WeightGrad {
    pub(super) stride: usize,
    pub(super) padding: usize,
    pub(super) k: usize,
    pub(super) bf16: Option<Tier>,
}

impl CustomOp2 for WeightGrad {
    fn name(&self) -> &'static str {
        "trainyard-conv2d-weight-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (batch, c_in, h, w) = l1.shape().dims4()?;
        let (_, c_out, _, _) = l2.shape().dims4()?;
        let g = Geometry {
            batch,
            c_in,
            h,
            w,
            c_out,
            k: self.k,
            stride: self.stride,
            padding: self.padding,
            bf16: self.bf16,
        };
        let (x, gy) = (slice(s1, l1)?, slice(s2, l2)?);
        let (ohw, ckk, img_len) = (g.out_hw(), g.ckk(), c_in * h * w);
        let tk = tasks(&g);
        let cols_max = tk.images * ohw;
        // Fixed, contiguous image ranges per partial sum; partials added in order → deterministic.
        let parts = threads().min(batch.div_ceil(tk.images)).max(1);
        let per_part = batch.div_ceil(parts);
        // With few output channels the GEMM reads col in place as its right operand when the destination
        // is column-major; row-major, it transposes the product and repacks col, a copy as large as
        // im2col itself. With many, col is reread once per 16 output channels, and packing it pays.
        // (bf16 products keep the sum as (ckk x c_out) too: col is their left operand, made row by row.)
        let col_in_place = c_out <= 128 || g.bf16.is_some();
        let acc_strides = if col_in_place { (1, c_out) } else { (ckk, 1) };
        let partials: Vec<Vec<f32>> = (0..parts)
            .into_par_iter()
            .map(|part| {
                let mut acc = vec![0f32; c_out * ckk];
                with_scratch((ckk + c_out) * cols_max, |buf| {
                    let (col, gathered) = buf.split_at_mut(ckk * cols_max);
                    let end = ((part + 1) * per_part).min(batch);
                    let mut first = part * per_part;
                    while first < end {
                        let images = tk.images.min(end - first);
                        let cols = images * ohw;
                        let gy_task = &gy[first * c_out * ohw..(first + images) * c_out * ohw];
                        let lhs: &[f32] = if images == 1 {
                            gy_task
                        } else {
                            gather_channels(gy_task, c_out, ohw, images, gathered);
                            &gathered[..c_out * cols]
                        };
                        if let Some(tier) = g.bf16 {
                            // acc (ckk x c_out) += col (ckk x cols, made row by row) * gy^T.
                            let rows =
                                im2col_rows(&g, &x[first * img_len..(first + images) * img_len]);
                            let operands = (Operand::Rows(&rows), Operand::Strided(lhs, (1, cols)));
                            let parallel = !matches!(tk.par, Parallelism::None);
                            let dims = (ckk, c_out, cols);
                            let dst = (&mut acc[..], (c_out, 1));
                            bf16::product(tier, dims, dst, Write::Accumulate, operands, parallel);
                            first += images;
                            continue;
                        }
                        for i in 0..images {
                            im2col(
                                &g,
                                &x[(first + i) * img_len..][..img_len],
                                col,
                                cols,
                                i * ohw,
                            );
                        }
                        // acc (c_out x ckk) += gy (c_out x cols) * col^T (see `col_in_place`).
                        strided_matmul(
                            (c_out, ckk, cols),
                            (&mut acc, acc_strides),
                            true,
                            (lhs, (cols, 1)),
                            (col, (1, cols)),
                            tk,
                        );
                        first += images;
                    }
                });
                acc
            })
            .collect();
        // Partials in order, then the (ckk x c_out) sum transposed to the kernel's (c_out x ckk) layout.
        let mut sum = partials[0].clone();
        for p in &partials[1..] {
            for (a, b) in sum.iter_mut().zip(p) {
                *a += b;
            }
        }
        // Under bf16, the gradient rounded as autocast's bf16 weight gradient is.
        let finish = |v: f32| if g.bf16.is_some() { bf16::round(v) } else { v };
        let gw = if col_in_place {
            let mut gw = vec![0f32; c_out * ckk];
            for (r, row) in sum.chunks_exact(c_out).enumerate() {
                for (o, v) in row.iter().enumerate() {
                    gw[o * ckk + r] = finish(*v);
                }
            }
            gw
        } else {
            sum
        };
        Ok((
            CpuStorage::F32(gw),
            Shape::from((c_out, c_in, self.k, self.k)),
        ))
    }
}
