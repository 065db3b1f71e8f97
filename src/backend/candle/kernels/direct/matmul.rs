//! Matrix products on `trainyard_conv::gemm` (AVX-512 where the CPU has it): the Candle op, with its
//! backward, and `linear` (`x @ wᵀ + b`). Operands are read through their strides, so the transposes of
//! `linear` and of the backward pass (`dA = dC·Bᵀ`, `dB = Aᵀ·dC`) are never copied.

use crate::backend::candle::kernels::tape;
use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};
use trainyard_conv::gemm::{matmul as gemm, matmul_bias as gemm_bias, Dims, Strides};
use trainyard_conv::Isa;

/// The Candle op: `a (…, m, k) @ b (…, k, n)` with equal leading dimensions.
struct Matmul {
    isa: Isa,
}

/// The leading dimensions of a layout as one batch stride, when they collapse to one (a contiguous run of
/// matrices, or one matrix repeated); `None` otherwise.
fn batch_stride(l: &Layout) -> Option<usize> {
    let (dims, strides) = (l.dims(), l.stride());
    // (stride of the innermost batch dimension, the stride the next outer one must have)
    let mut run: Option<(usize, usize)> = None;
    for i in (0..dims.len() - 2).rev() {
        if dims[i] == 1 {
            continue;
        }
        run = match run {
            None => Some((strides[i], dims[i] * strides[i])),
            Some((s, next)) if strides[i] == next => Some((s, dims[i] * next)),
            _ => return None,
        };
    }
    Some(run.map_or(0, |(s, _)| s))
}

/// The sizes and strides of one operand (`None` when its batch does not collapse).
fn operand(l: &Layout) -> Option<(usize, usize, usize, Strides)> {
    let dims = l.dims();
    let r = dims.len();
    let batch = dims[..r - 2].iter().product();
    let s = l.stride();
    let strides = Strides {
        batch: batch_stride(l)?,
        row: s[r - 2],
        col: s[r - 1],
    };
    Some((batch, dims[r - 2], dims[r - 1], strides))
}

fn cpu_values<'a>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [f32]> {
    Ok(&s.as_slice::<f32>()?[l.start_offset()..])
}

impl CustomOp2 for Matmul {
    fn name(&self) -> &'static str {
        "trainyard-matmul"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (Some((batch, m, k, sa)), Some((batch2, k2, n, sb))) = (operand(l1), operand(l2))
        else {
            candle_core::bail!(
                "trainyard matmul: operands whose batch does not collapse to one stride"
            )
        };
        if batch != batch2
            || k != k2
            || l1.dims()[..l1.dims().len() - 2] != l2.dims()[..l2.dims().len() - 2]
        {
            candle_core::bail!(
                "trainyard matmul: shapes {:?} and {:?} do not multiply",
                l1.shape(),
                l2.shape()
            );
        }
        let d = Dims { batch, m, k, n };
        let c = gemm(
            self.isa,
            d,
            (cpu_values(s1, l1)?, sa),
            (cpu_values(s2, l2)?, sb),
        );
        let mut shape = l1.dims().to_vec();
        *shape.last_mut().expect("rank >= 2") = n;
        Ok((CpuStorage::F32(c), Shape::from(shape)))
    }

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let r = a.rank();
        let da = if a.track_op() {
            Some(product(self.isa, grad, &b.transpose(r - 2, r - 1)?)?)
        } else {
            None
        };
        let db = if b.track_op() {
            Some(product(self.isa, &a.transpose(r - 2, r - 1)?, grad)?)
        } else {
            None
        };
        Ok((da, db))
    }
}

/// `t` as the kernels can read it: itself, or a contiguous copy when its batch does not collapse to one
/// stride.
fn readable(t: &Tensor) -> Result<Tensor> {
    if operand(t.layout()).is_some() {
        Ok(t.clone())
    } else {
        t.contiguous()
    }
}

/// `a @ b` untracked (the backward pass's products).
fn product(isa: Isa, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    readable(a)?.apply_op2_no_bwd(&readable(b)?, &Matmul { isa })
}

/// Whether the op takes these operands: f32 on the CPU, rank ≥ 2, same rank.
fn takes(a: &Tensor, b: &Tensor) -> bool {
    crate::tensor::candle_cpu::is_cpu_f32(a)
        && crate::tensor::candle_cpu::is_cpu_f32(b)
        && a.rank() >= 2
        && a.rank() == b.rank()
}

/// `a @ b` (batched, broadcasting like `broadcast_matmul`), on `isa`'s kernels for f32 CPU tensors and
/// Candle's matmul otherwise.
pub fn matmul(isa: Isa, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if !takes(a, b) || a.dims()[..a.rank() - 2] != b.dims()[..b.rank() - 2] {
        return a.broadcast_matmul(b);
    }
    tape::op2(&readable(a)?, &readable(b)?, Matmul { isa })
}

/// `x @ wᵀ + bias` for a (rows × in) `x`, (out × in) `w` and (out) `bias`: the bias is where the sums
/// start, and the backward pass computes `dw = dyᵀ·x` in `w`'s own layout and `db` as column sums.
struct Linear {
    isa: Isa,
}

/// A rank-2 operand's values from its first element, and its strides.
fn matrix<'a>(s: &'a CpuStorage, l: &Layout) -> Result<(&'a [f32], Strides)> {
    match operand(l) {
        Some((1, _, _, strides)) if l.dims().len() == 2 => Ok((cpu_values(s, l)?, strides)),
        _ => candle_core::bail!("trainyard linear: expected a matrix, got {:?}", l.shape()),
    }
}

/// Runs `f` on a CPU f32 tensor's values (from its first element) and strides.
fn with_matrix<T>(t: &Tensor, f: impl FnOnce((&[f32], Strides)) -> Result<T>) -> Result<T> {
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        candle_core::Storage::Cpu(s) => f(matrix(s, layout)?),
        _ => candle_core::bail!("trainyard linear: expected a CPU tensor"),
    }
}

impl candle_core::CustomOp3 for Linear {
    fn name(&self) -> &'static str {
        "trainyard-linear"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let ((x, sx), (w, sw)) = (matrix(s1, l1)?, matrix(s2, l2)?);
        let ((rows, k), (out, k2)) = (l1.shape().dims2()?, l2.shape().dims2()?);
        let bias = crate::tensor::candle_cpu::f32_slice(s3, l3)?;
        if k != k2 || bias.len() != out {
            candle_core::bail!(
                "trainyard linear: {:?} @ {:?}ᵀ + {:?}",
                l1.shape(),
                l2.shape(),
                l3.shape()
            );
        }
        let d = Dims {
            batch: 1,
            m: rows,
            k,
            n: out,
        };
        let y = gemm_bias(self.isa, d, (x, sx), (w, sw.t()), bias);
        Ok((CpuStorage::F32(y), Shape::from((rows, out))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let ((rows, k), out) = (x.dims2()?, w.dim(0)?);
        let dev = x.device();
        crate::backend::candle::kernels::cpu::with_f32(grad, |dy| {
            let sdy = Strides::contiguous(rows, out);
            let dx = if x.track_op() {
                let d = Dims {
                    batch: 1,
                    m: rows,
                    k: out,
                    n: k,
                };
                let v = with_matrix(w, |w| Ok(gemm(self.isa, d, (dy, sdy), w)))?;
                Some(Tensor::from_vec(v, (rows, k), dev)?)
            } else {
                None
            };
            let dw = if w.track_op() {
                let d = Dims {
                    batch: 1,
                    m: out,
                    k: rows,
                    n: k,
                };
                let v = with_matrix(x, |x| Ok(gemm(self.isa, d, (dy, sdy.t()), x)))?;
                Some(Tensor::from_vec(v, (out, k), dev)?)
            } else {
                None
            };
            let db = if b.track_op() {
                let v = trainyard_conv::rowwise::column_sums(self.isa, dy, out);
                Some(Tensor::from_vec(v, out, dev)?)
            } else {
                None
            };
            Ok((dx, dw, db))
        })
    }
}

/// `x @ wᵀ + bias` over the last dimension of `x` (PyTorch's `nn.Linear`): the leading dimensions are
/// folded into the rows of one product.
pub fn linear(isa: Isa, x: &Tensor, w: &Tensor, bias: &Tensor) -> Result<Tensor> {
    let cpu = crate::tensor::candle_cpu::is_cpu_f32;
    if !(cpu(x) && cpu(w) && cpu(bias)) || x.rank() < 2 || w.rank() != 2 || bias.rank() != 1 {
        return x.broadcast_matmul(&w.t()?)?.broadcast_add(bias);
    }
    let dims = x.dims().to_vec();
    let features = dims[dims.len() - 1];
    let rows = x.elem_count() / features.max(1);
    let y = tape::op3(
        &readable(&tape::ops::reshape(x, (rows, features))?)?,
        &readable(w)?,
        &bias.contiguous()?,
        Linear { isa },
    )?;
    let mut out = dims;
    *out.last_mut().expect("rank >= 2") = w.dim(0)?;
    tape::ops::reshape(&y, out)
}
