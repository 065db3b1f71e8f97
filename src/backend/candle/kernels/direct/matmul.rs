//! Matrix products on `trainyard_conv::gemm` (AVX-512 where the CPU has it): the Candle op, with its
//! backward, and `linear` (`x @ wᵀ + b`). Operands are read through their strides, so the transposes of
//! `linear` and of the backward pass (`dA = dC·Bᵀ`, `dB = Aᵀ·dC`) are never copied.
//!
//! Under bf16 autocast on a CPU with bf16 instructions (`bf16: Some(tier)`), the same ops run on
//! `trainyard_conv::bf16`: operands rounded to bf16 as they are packed, f32 sums, each result rounded as
//! it is stored. That is the emulated composition's numbers (`Autocast`'s roundings around an f32
//! product, and their backward: the incoming gradient rounded, each product's result rounded). A linear
//! layer's caller may say its input, or its result's gradient, holds bf16s already (`Rounded`: a ViT's
//! LayerNorm, attention and GELU store them), and the `fma` tier then reads them in place rather than
//! rounding copies; the backward rounds the incoming gradient once for both products and the bias.

use super::Rounded;
use crate::backend::candle::kernels::tape;
use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use trainyard_conv::bf16::{self, Operand, Tier, Write};
use trainyard_conv::gemm::{matmul as gemm, matmul_bias as gemm_bias, Dims, Strides};
use trainyard_conv::Isa;

/// The Candle op: `a (…, m, k) @ b (…, k, n)` with equal leading dimensions.
struct Matmul {
    isa: Isa,
    /// bf16 autocast's product on this tier.
    bf16: Option<Tier>,
}

/// `a @ b` for each of `d.batch` pairs on a bf16 tier: C = bf16(bf16(A)·bf16(B)) with f32 sums. A
/// batch of small products (attention's heads) runs one product per thread; one large one spreads
/// over all.
fn bf16_gemm(
    tier: Tier,
    d: Dims,
    (a, sa): (&[f32], Strides),
    (b, sb): (&[f32], Strides),
) -> Vec<f32> {
    let mut c = vec![0f32; d.batch * d.m * d.n];
    if c.is_empty() || d.k == 0 {
        return c;
    }
    let one = |i: usize, out: &mut [f32], parallel: bool| {
        let a = Operand::Strided(&a[i * sa.batch..], (sa.row, sa.col));
        let b = Operand::Strided(&b[i * sb.batch..], (sb.row, sb.col));
        let dst = (out, (d.n, 1));
        bf16::product(
            tier,
            (d.m, d.n, d.k),
            dst,
            Write::StoreBf16,
            (a, b),
            parallel,
        );
    };
    if d.batch < rayon::current_num_threads() {
        // Fewer products than threads: each on all of them.
        for (i, out) in c.chunks_mut(d.m * d.n).enumerate() {
            one(i, out, true);
        }
    } else {
        c.par_chunks_mut(d.m * d.n)
            .enumerate()
            .for_each(|(i, out)| one(i, out, false));
    }
    c
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
        let (a, b) = ((cpu_values(s1, l1)?, sa), (cpu_values(s2, l2)?, sb));
        let c = match self.bf16 {
            Some(tier) => bf16_gemm(tier, d, a, b),
            None => gemm(self.isa, d, a, b),
        };
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
            Some(product(self, grad, &b.transpose(r - 2, r - 1)?)?)
        } else {
            None
        };
        let db = if b.track_op() {
            Some(product(self, &a.transpose(r - 2, r - 1)?, grad)?)
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

/// `a @ b` untracked (the backward pass's products; under bf16 autocast the gradient is rounded as it
/// is packed, and the result as it is stored, as the emulated composition's backward rounds them).
fn product(op: &Matmul, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    readable(a)?.apply_op2_no_bwd(&readable(b)?, op)
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
    tape::op2(&readable(a)?, &readable(b)?, Matmul { isa, bf16: None })
}

/// bf16 autocast's `a @ b` on `tier` (`bf16(bf16(a) @ bf16(b))`, differentiable), for the operands the
/// op takes; `None` for others (the caller composes the roundings).
pub fn matmul_bf16(isa: Isa, tier: Tier, a: &Tensor, b: &Tensor) -> Result<Option<Tensor>> {
    if !takes(a, b) || a.dims()[..a.rank() - 2] != b.dims()[..b.rank() - 2] {
        return Ok(None);
    }
    let op = Matmul {
        isa,
        bf16: Some(tier),
    };
    tape::op2(&readable(a)?, &readable(b)?, op).map(Some)
}

/// `x @ wᵀ + bias` for a (rows × in) `x`, (out × in) `w` and (out) `bias`: the bias is where the sums
/// start, and the backward pass computes `dw = dyᵀ·x` in `w`'s own layout and `db` as column sums.
struct Linear {
    isa: Isa,
    /// bf16 autocast's `addmm` on this tier: `bf16(bf16(x)·bf16(w)ᵀ + bf16(bias))`.
    bf16: Option<Tier>,
    /// What holds bf16s already (`x`; the gradient of the result), so the `fma` tier reads it in place.
    rounded: Rounded,
}

impl Linear {
    /// `x` (a matrix with strides `sx`) as a bf16 product's operand.
    fn x_operand<'a>(&self, (x, sx): (&'a [f32], Strides)) -> Operand<'a> {
        if self.rounded.input {
            Operand::Bf16(x, (sx.row, sx.col))
        } else {
            Operand::Strided(x, (sx.row, sx.col))
        }
    }
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
        let y = match self.bf16 {
            // bf16 autocast's `addmm`: the bias added to the f32 sums, then one rounding.
            Some(tier) => {
                let w = Operand::Strided(w, (sw.col, sw.row));
                bf16::rounded_product(
                    tier,
                    (rows, out, k),
                    (self.x_operand((x, sx)), w),
                    Some(bias),
                    true,
                )
            }
            None => gemm_bias(self.isa, d, (x, sx), (w, sw.t()), bias),
        };
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
        crate::backend::candle::kernels::cpu::with_f32(grad, |dy| match self.bf16 {
            Some(tier) => self.backward_bf16(tier, (x, w, b), dy),
            None => self.backward_f32((x, w, b), dy),
        })
    }
}

/// The gradients of one linear layer.
type LinearGrads = (Option<Tensor>, Option<Tensor>, Option<Tensor>);

impl Linear {
    /// The backward pass in f32: `dx = dy·w`, `dw = dyᵀ·x` (in `w`'s own layout), `db` as column sums.
    fn backward_f32(
        &self,
        (x, w, b): (&Tensor, &Tensor, &Tensor),
        dy: &[f32],
    ) -> Result<LinearGrads> {
        let ((rows, k), out) = (x.dims2()?, w.dim(0)?);
        let dev = x.device();
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
    }

    /// The backward pass of bf16 autocast's `addmm` on `tier`: the incoming gradient rounded once (as
    /// the result's cast rounds it going back; unless `rounded.grad` says its reader did) and read in
    /// place by both products and the bias's sums; each product rounded as it is stored.
    fn backward_bf16(
        &self,
        tier: Tier,
        (x, w, b): (&Tensor, &Tensor, &Tensor),
        dy: &[f32],
    ) -> Result<LinearGrads> {
        let ((rows, k), out) = (x.dims2()?, w.dim(0)?);
        let dev = x.device();
        let dy: std::borrow::Cow<[f32]> = if self.rounded.grad {
            dy.into()
        } else {
            bf16::rounded(dy).into()
        };
        let dx = if x.track_op() {
            let v = with_matrix(w, |(w, sw)| {
                let (dy, w) = (
                    Operand::Bf16(&dy, (out, 1)),
                    Operand::Strided(w, (sw.row, sw.col)),
                );
                Ok(bf16::rounded_product(
                    tier,
                    (rows, k, out),
                    (dy, w),
                    None,
                    true,
                ))
            })?;
            Some(Tensor::from_vec(v, (rows, k), dev)?)
        } else {
            None
        };
        let dw = if w.track_op() {
            let v = with_matrix(x, |x| {
                let ops = (Operand::Bf16(&dy, (1, out)), self.x_operand(x));
                Ok(bf16::rounded_product(tier, (out, k, rows), ops, None, true))
            })?;
            Some(Tensor::from_vec(v, (out, k), dev)?)
        } else {
            None
        };
        let db = if b.track_op() {
            // The sums of the rounded gradient, rounded (the emulated composition's).
            let sums = trainyard_conv::rowwise::column_sums(self.isa, &dy, out);
            Some(Tensor::from_vec(
                sums.into_iter().map(bf16::round).collect(),
                out,
                dev,
            )?)
        } else {
            None
        };
        Ok((dx, dw, db))
    }
}

/// `x @ wᵀ + bias` over the last dimension of `x` (PyTorch's `nn.Linear`): the leading dimensions are
/// folded into the rows of one product.
pub fn linear(isa: Isa, x: &Tensor, w: &Tensor, bias: &Tensor) -> Result<Tensor> {
    linear_on(isa, (None, Rounded::NONE), x, w, bias)
}

/// bf16 autocast's `linear` on `tier` (`bf16(bf16(x) @ bf16(w)ᵀ + bf16(bias))`, differentiable).
/// `rounded`: what holds bf16 values already (`x`, as its producer stored it; the gradient of the result,
/// as its reader passes it back), so the `fma` tier reads it in place; `Rounded::NONE` is always right.
pub fn linear_bf16(
    isa: Isa,
    tier: Tier,
    (x, rounded): (&Tensor, Rounded),
    w: &Tensor,
    bias: &Tensor,
) -> Result<Option<Tensor>> {
    let cpu = crate::tensor::candle_cpu::is_cpu_f32;
    if !(cpu(x) && cpu(w) && cpu(bias)) || x.rank() < 2 || w.rank() != 2 || bias.rank() != 1 {
        return Ok(None);
    }
    #[cfg(test)]
    let rounded = {
        use super::conv::tests::{DISTRUSTED, TRUST_ROUNDED};
        if rounded != Rounded::NONE && !TRUST_ROUNDED.get() {
            DISTRUSTED.set(DISTRUSTED.get() + 1);
            Rounded::NONE
        } else {
            rounded
        }
    };
    linear_on(isa, (Some(tier), rounded), x, w, bias).map(Some)
}

fn linear_on(
    isa: Isa,
    (bf16, rounded): (Option<Tier>, Rounded),
    x: &Tensor,
    w: &Tensor,
    bias: &Tensor,
) -> Result<Tensor> {
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
        Linear { isa, bf16, rounded },
    )?;
    let mut out = dims;
    *out.last_mut().expect("rank >= 2") = w.dim(0)?;
    tape::ops::reshape(&y, out)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::backend::candle::autocast::Autocast;
    use crate::backend::candle::kernels::cpu::{max_rel, seeded};
    use candle_core::{DType, Var};

    pub(in crate::backend::candle::kernels::direct) const EMULATED: Autocast = Autocast {
        bf16: true,
        tier: None,
    };

    /// Every value of `t` is a bf16 value.
    fn assert_rounded(t: &Tensor, what: &str) {
        let flat = t.flatten_all().unwrap();
        let rounded = flat
            .to_dtype(DType::BF16)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        assert_eq!(
            rounded.to_vec1::<f32>().unwrap(),
            flat.to_vec1::<f32>().unwrap(),
            "{what} is not rounded to bf16"
        );
    }

    /// `ours` and the emulated composition's `theirs` (forward, then the gradients of `vars` for a probe
    /// loss) agree to one bf16 rounding, and every result is a bf16 value.
    pub(in crate::backend::candle::kernels::direct) fn assert_as_emulated(
        ours: Tensor,
        theirs: Tensor,
        vars: &[(&str, &Var)],
        tier: Tier,
    ) {
        let tol = 1.0 / 128.0;
        assert!(
            max_rel(&ours, &theirs) < tol,
            "forward on {}: {}",
            tier.name(),
            max_rel(&ours, &theirs)
        );
        assert_rounded(&ours, "the result");
        let probe = seeded(ours.dims(), 9, -1.0, 1.0);
        let grads = |y: Tensor| (y * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        let (g_ours, g_theirs) = (grads(ours), grads(theirs));
        for (name, v) in vars {
            let (a, b) = (g_ours.get(v).unwrap(), g_theirs.get(v).unwrap());
            assert!(
                max_rel(a, b) < tol,
                "{name} gradient on {}: {}",
                tier.name(),
                max_rel(a, b)
            );
            assert_rounded(a, name);
        }
    }

    /// bf16 autocast's `linear` and batched `matmul` on each bf16 tier equal the emulated roundings
    /// around f32 products, forward and backward (ViT's projections, MLP and attention products).
    #[rstest::rstest]
    #[case::one_row(1, 8, 4)]
    #[case::vit_tiny_mlp(130, 192, 768)]
    #[case::odd(33, 45, 17)]
    fn bf16_tiers_match_emulated_autocast(
        #[case] rows: usize,
        #[case] features: usize,
        #[case] out: usize,
        #[values("amx", "avx512-bf16", "fma", "portable")] tier: &str,
    ) {
        let Some(tier) = Tier::parse(tier).filter(|t| t.supported()) else {
            return;
        };
        let isa = Isa::detected();
        let x = Var::from_tensor(&seeded(&[2, rows, features], 1, -1.0, 1.0)).unwrap();
        let w = Var::from_tensor(&seeded(&[out, features], 2, -1.0, 1.0)).unwrap();
        let b = Var::from_tensor(&seeded(&[out], 3, -1.0, 1.0)).unwrap();
        let ours = linear_bf16(isa, tier, (&x, Rounded::NONE), &w, &b)
            .unwrap()
            .expect("f32 CPU operands");
        let theirs = EMULATED.linear(&x, &w, &b).unwrap();
        assert_as_emulated(ours, theirs, &[("x", &x), ("w", &w), ("bias", &b)], tier);

        // Attention's products: (batch·heads, rows, features) @ (…, features, rows), and a transposed
        // operand read through its strides.
        let q = Var::from_tensor(&seeded(&[3, rows, features], 4, -1.0, 1.0)).unwrap();
        let k = Var::from_tensor(&seeded(&[3, rows, features], 5, -1.0, 1.0)).unwrap();
        let kt = k.t().unwrap();
        let ours = matmul_bf16(isa, tier, &q, &kt)
            .unwrap()
            .expect("f32 CPU operands");
        let theirs = EMULATED.matmul(&q, &kt).unwrap();
        assert_as_emulated(ours, theirs, &[("q", &q), ("k", &k)], tier);
    }
}
