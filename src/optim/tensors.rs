//! The optimizer rules' tensor interface on each kind of tensor the engines and the sharded strategy keep
//! parameters in: Candle tensors, libtorch tensors and flat vectors (`tensor::Flat`).

use super::OptTensor;
use crate::registry::{AnyRule, OptimizerStep, ParamState};
use crate::tensor::flat::{Flat, Pair};

/// Candle tensors under the shared optimizer rules.
impl OptTensor for candle_core::Tensor {
    fn duplicate(&self) -> Self {
        self.clone()
    }
    fn owned_copy(&self) -> anyhow::Result<Self> {
        Ok(self.clone()) // Candle tensors are immutable: no buffer is ever written in place
    }
    fn affine(&self, mul: f64, add: f64) -> anyhow::Result<Self> {
        Ok(candle_core::Tensor::affine(self, mul, add)?)
    }
    fn plus(&self, other: &Self) -> anyhow::Result<Self> {
        Ok((self + other)?)
    }
    fn minus(&self, other: &Self) -> anyhow::Result<Self> {
        Ok((self - other)?)
    }
    fn divide(&self, other: &Self) -> anyhow::Result<Self> {
        Ok(self.div(other)?)
    }
    fn square(&self) -> anyhow::Result<Self> {
        Ok(self.sqr()?)
    }
    fn root(&self) -> anyhow::Result<Self> {
        Ok(self.sqrt()?)
    }
    fn clamp_abs(&self, max: f64) -> anyhow::Result<Self> {
        Ok(self.clamp(-max, max)?)
    }
    fn times(&self, other: &Self) -> anyhow::Result<Self> {
        Ok((self * other)?)
    }
    fn signum(&self) -> anyhow::Result<Self> {
        Ok(self.sign()?)
    }
    fn registered_update(
        rule: &dyn AnyRule,
        p: &Self,
        grad: &Self,
        state: &mut ParamState<'_, Self>,
        step: &OptimizerStep,
    ) -> anyhow::Result<Self> {
        rule.on_candle(p, grad, state, step)
    }
    /// On the CPU in f32: one parallel pass, no squared copy (the trainer logs the gradient norm every
    /// step); elsewhere Candle's ops.
    fn sum_of_squares(&self) -> anyhow::Result<f64> {
        use crate::tensor::candle_cpu::{is_cpu_f32, with_f32};
        if is_cpu_f32(self) {
            return Ok(with_f32(self, |v| Ok(host_sum_of_squares(v)))?);
        }
        Ok(self.sqr()?.sum_all()?.to_scalar::<f32>()? as f64)
    }
    /// On the CPU in f32: one pass instead of six (each a full read and write of the parameter).
    fn sgd_momentum_fused(
        &self,
        grad: &Self,
        buf: Option<&Self>,
        k: super::SgdStep,
    ) -> Option<anyhow::Result<(Self, Self)>> {
        use crate::tensor::candle_cpu::{is_cpu_f32, with_f32};
        let fits = |t: &Self| is_cpu_f32(t) && t.shape() == self.shape();
        if !fits(self) || !fits(grad) || !buf.is_none_or(fits) {
            return None;
        }
        let run = || -> anyhow::Result<(Self, Self)> {
            let (new_p, new_buf) = with_f32(self, |p| {
                with_f32(grad, |g| match buf {
                    Some(b) => with_f32(b, |b| Ok(sgd_pass(p, g, Some(b), k))),
                    None => Ok(sgd_pass(p, g, None, k)),
                })
            })?;
            let (shape, dev) = (self.shape(), self.device());
            Ok((
                candle_core::Tensor::from_vec(new_p, shape, dev)?,
                candle_core::Tensor::from_vec(new_buf, shape, dev)?,
            ))
        };
        Some(run())
    }
}

/// The SGD rule of `Optimizer::update` element by element, in its order of f32 operations (Candle's affine
/// is `v * mul + add`), so the result is the same to the bit.
fn sgd_pass(p: &[f32], g: &[f32], buf: Option<&[f32]>, k: super::SgdStep) -> (Vec<f32>, Vec<f32>) {
    use rayon::prelude::*;
    let (lr, wd, m) = (k.lr as f32, k.weight_decay as f32, k.momentum as f32);
    use trainyard_conv::buffer::{assume_init, uninit};
    let (mut new_p, mut new_buf) = (uninit(p.len()), uninit(p.len()));
    const CHUNK: usize = 1 << 14;
    new_p
        .par_chunks_mut(CHUNK)
        .zip(new_buf.par_chunks_mut(CHUNK))
        .enumerate()
        .for_each(|(c, (np, nb))| {
            let r = c * CHUNK..(c * CHUNK + np.len());
            let (p, g) = (&p[r.clone()], &g[r.clone()]);
            let b = buf.map(|b| &b[r]);
            // One loop per combination of the rule's options, so each has no branch and vectorises.
            match (k.weight_decay != 0.0, b, k.nesterov) {
                (false, None, false) => {
                    sgd_chunk::<false, false>(p, g, None, (np, nb), (wd, m, lr))
                }
                (false, None, true) => sgd_chunk::<false, true>(p, g, None, (np, nb), (wd, m, lr)),
                (true, None, false) => sgd_chunk::<true, false>(p, g, None, (np, nb), (wd, m, lr)),
                (true, None, true) => sgd_chunk::<true, true>(p, g, None, (np, nb), (wd, m, lr)),
                (false, Some(b), false) => {
                    sgd_chunk::<false, false>(p, g, Some(b), (np, nb), (wd, m, lr))
                }
                (false, Some(b), true) => {
                    sgd_chunk::<false, true>(p, g, Some(b), (np, nb), (wd, m, lr))
                }
                (true, Some(b), false) => {
                    sgd_chunk::<true, false>(p, g, Some(b), (np, nb), (wd, m, lr))
                }
                (true, Some(b), true) => {
                    sgd_chunk::<true, true>(p, g, Some(b), (np, nb), (wd, m, lr))
                }
            }
        });
    // SAFETY: every element of both buffers was written above.
    unsafe { (assume_init(new_p), assume_init(new_buf)) }
}

/// Σ v² in fixed chunks (f32 sums over 16 interleaved lanes, so they vectorise; chunks added in f64 in
/// order): the same value on any thread count.
fn host_sum_of_squares(v: &[f32]) -> f64 {
    use rayon::prelude::*;
    let partial: Vec<f64> = v
        .par_chunks(1 << 14)
        .map(|c| {
            let mut acc = [0f32; 16];
            let mut it = c.chunks_exact(16);
            for block in &mut it {
                for (a, x) in acc.iter_mut().zip(block) {
                    *a += x * x;
                }
            }
            let tail: f32 = it.remainder().iter().map(|x| x * x).sum();
            acc.iter().map(|&a| f64::from(a)).sum::<f64>() + f64::from(tail)
        })
        .collect();
    partial.iter().sum()
}

/// One chunk of `sgd_pass` for one combination of weight decay and Nesterov (a momentum buffer or not).
#[inline(always)]
fn sgd_chunk<const DECAY: bool, const NESTEROV: bool>(
    p: &[f32],
    g: &[f32],
    b: Option<&[f32]>,
    (np, nb): (
        &mut [std::mem::MaybeUninit<f32>],
        &mut [std::mem::MaybeUninit<f32>],
    ),
    (wd, m, lr): (f32, f32, f32),
) {
    let n = np.len();
    let (p, g, nb) = (&p[..n], &g[..n], &mut nb[..n]);
    let one = |i: usize, bi: Option<f32>| {
        let gw = if DECAY {
            g[i] + (p[i] * wd + 0.0)
        } else {
            g[i]
        };
        let bn = match bi {
            Some(bv) => (bv * m + 0.0) + gw,
            None => gw,
        };
        let step = if NESTEROV { gw + (bn * m + 0.0) } else { bn };
        (bn, p[i] - (step * lr + 0.0))
    };
    match b {
        Some(b) => {
            let b = &b[..n];
            for i in 0..n {
                let (bn, pn) = one(i, Some(b[i]));
                nb[i].write(bn);
                np[i].write(pn);
            }
        }
        None => {
            for i in 0..n {
                let (bn, pn) = one(i, None);
                nb[i].write(bn);
                np[i].write(pn);
            }
        }
    }
}

#[cfg(feature = "torch")]
/// libtorch tensors under the shared optimizer rules.
impl OptTensor for tch::Tensor {
    fn duplicate(&self) -> Self {
        self.shallow_clone()
    }
    fn owned_copy(&self) -> anyhow::Result<Self> {
        Ok(self.f_detach_copy()?)
    }
    fn affine(&self, mul: f64, add: f64) -> anyhow::Result<Self> {
        // One kernel where one does: the optimizer calls this with add = 0 (or mul = 1) almost always.
        Ok(match (mul == 1.0, add == 0.0) {
            (true, true) => self.shallow_clone(),
            (false, true) => self.f_mul_scalar(mul)?,
            (true, false) => self.f_add_scalar(add)?,
            (false, false) => self.f_mul_scalar(mul)?.f_add_scalar(add)?,
        })
    }
    fn plus(&self, other: &Self) -> anyhow::Result<Self> {
        Ok(self.f_add(other)?)
    }
    fn minus(&self, other: &Self) -> anyhow::Result<Self> {
        Ok(self.f_sub(other)?)
    }
    fn divide(&self, other: &Self) -> anyhow::Result<Self> {
        Ok(self.f_div(other)?)
    }
    fn square(&self) -> anyhow::Result<Self> {
        Ok(self.f_square()?)
    }
    fn root(&self) -> anyhow::Result<Self> {
        Ok(self.f_sqrt()?)
    }
    fn clamp_abs(&self, max: f64) -> anyhow::Result<Self> {
        Ok(self.f_clamp(-max, max)?)
    }
    fn times(&self, other: &Self) -> anyhow::Result<Self> {
        Ok(self.f_mul(other)?)
    }
    fn signum(&self) -> anyhow::Result<Self> {
        Ok(self.f_sign()?)
    }
    fn registered_update(
        rule: &dyn AnyRule,
        p: &Self,
        grad: &Self,
        state: &mut ParamState<'_, Self>,
        step: &OptimizerStep,
    ) -> anyhow::Result<Self> {
        rule.on_tch(p, grad, state, step)
    }
    fn sum_of_squares(&self) -> anyhow::Result<f64> {
        Ok(self
            .f_to_kind(tch::Kind::Double)?
            .f_square()?
            .f_sum(tch::Kind::Double)?
            .f_double_value(&[])?)
    }
}

fn zip_host(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) -> Flat {
    Flat::Host(a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect())
}

fn map_host(a: &[f32], f: impl Fn(f32) -> f32) -> Flat {
    Flat::Host(a.iter().map(|&x| f(x)).collect())
}

/// The shared optimizer rules on a flat vector: element-wise f32 in both places, so sharded and
/// unsharded runs take the same steps.
impl OptTensor for Flat {
    fn duplicate(&self) -> Self {
        self.handle()
    }
    fn owned_copy(&self) -> anyhow::Result<Self> {
        match self {
            Flat::Host(v) => Ok(Flat::Host(v.clone())),
            #[cfg(feature = "torch")]
            Flat::Tch(t) => Ok(Flat::Tch(OptTensor::owned_copy(t)?)),
        }
    }
    fn affine(&self, mul: f64, add: f64) -> anyhow::Result<Self> {
        match self {
            Flat::Host(v) => {
                let (m, a) = (mul as f32, add as f32);
                Ok(map_host(v, |x| x * m + a))
            }
            #[cfg(feature = "torch")]
            Flat::Tch(t) => Ok(Flat::Tch(OptTensor::affine(t, mul, add)?)),
        }
    }
    fn plus(&self, other: &Self) -> anyhow::Result<Self> {
        match self.pair(other)? {
            Pair::Host(a, b) => Ok(zip_host(a, b, |x, y| x + y)),
            #[cfg(feature = "torch")]
            Pair::Tch(a, b) => Ok(Flat::Tch(OptTensor::plus(a, b)?)),
        }
    }
    fn minus(&self, other: &Self) -> anyhow::Result<Self> {
        match self.pair(other)? {
            Pair::Host(a, b) => Ok(zip_host(a, b, |x, y| x - y)),
            #[cfg(feature = "torch")]
            Pair::Tch(a, b) => Ok(Flat::Tch(OptTensor::minus(a, b)?)),
        }
    }
    fn divide(&self, other: &Self) -> anyhow::Result<Self> {
        match self.pair(other)? {
            Pair::Host(a, b) => Ok(zip_host(a, b, |x, y| x / y)),
            #[cfg(feature = "torch")]
            Pair::Tch(a, b) => Ok(Flat::Tch(OptTensor::divide(a, b)?)),
        }
    }
    fn square(&self) -> anyhow::Result<Self> {
        match self {
            Flat::Host(v) => Ok(map_host(v, |x| x * x)),
            #[cfg(feature = "torch")]
            Flat::Tch(t) => Ok(Flat::Tch(OptTensor::square(t)?)),
        }
    }
    fn root(&self) -> anyhow::Result<Self> {
        match self {
            Flat::Host(v) => Ok(map_host(v, f32::sqrt)),
            #[cfg(feature = "torch")]
            Flat::Tch(t) => Ok(Flat::Tch(OptTensor::root(t)?)),
        }
    }
    fn clamp_abs(&self, max: f64) -> anyhow::Result<Self> {
        match self {
            Flat::Host(v) => {
                let m = max as f32;
                Ok(map_host(v, |x| x.clamp(-m, m)))
            }
            #[cfg(feature = "torch")]
            Flat::Tch(t) => Ok(Flat::Tch(OptTensor::clamp_abs(t, max)?)),
        }
    }
    fn sum_of_squares(&self) -> anyhow::Result<f64> {
        match self {
            Flat::Host(v) => Ok(v.iter().map(|&a| f64::from(a) * f64::from(a)).sum()),
            #[cfg(feature = "torch")]
            Flat::Tch(t) => OptTensor::sum_of_squares(t),
        }
    }
    fn times(&self, other: &Self) -> anyhow::Result<Self> {
        match self.pair(other)? {
            Pair::Host(a, b) => Ok(zip_host(a, b, |x, y| x * y)),
            #[cfg(feature = "torch")]
            Pair::Tch(a, b) => Ok(Flat::Tch(OptTensor::times(a, b)?)),
        }
    }
    fn signum(&self) -> anyhow::Result<Self> {
        match self {
            // torch.sign: 0 stays 0 (f32::signum gives ±1 for ±0), NaN stays NaN.
            Flat::Host(v) => Ok(map_host(v, |x| if x == 0.0 { 0.0 } else { x.signum() })),
            #[cfg(feature = "torch")]
            Flat::Tch(t) => Ok(Flat::Tch(OptTensor::signum(t)?)),
        }
    }
    /// A registered rule runs on the engine's tensor type: libtorch's for device vectors (no copy), Candle's
    /// CPU tensors for host vectors (the same f32 element-wise arithmetic).
    fn registered_update(
        rule: &dyn AnyRule,
        p: &Self,
        grad: &Self,
        state: &mut ParamState<'_, Self>,
        step: &OptimizerStep,
    ) -> anyhow::Result<Self> {
        #[cfg(feature = "torch")]
        if let (Flat::Tch(pt), Flat::Tch(gt)) = (p, grad) {
            return state.converted(
                |slot| match slot {
                    Flat::Tch(t) => Ok(t.shallow_clone()),
                    Flat::Host(_) => anyhow::bail!("a host slot beside a device parameter"),
                },
                |t| Ok(Flat::Tch(t)),
                |mine| Ok(Flat::Tch(rule.on_tch(pt, gt, mine, step)?)),
            );
        }
        let to_candle = |f: &Flat| -> anyhow::Result<candle_core::Tensor> {
            let v = f.host_values()?;
            Ok(candle_core::Tensor::from_slice(
                &v,
                v.len(),
                &candle_core::Device::Cpu,
            )?)
        };
        let from_candle = |t: candle_core::Tensor| -> anyhow::Result<Flat> {
            Ok(Flat::Host(t.to_vec1::<f32>()?))
        };
        let (pc, gc) = (to_candle(p)?, to_candle(grad)?);
        state.converted(to_candle, from_candle, |mine| {
            from_candle(rule.on_candle(&pc, &gc, mine, step)?)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(feature = "torch")]
    use crate::tensor::FlatHome;

    fn host(v: &[f32]) -> Flat {
        Flat::Host(v.to_vec())
    }

    #[test]
    fn host_vectors_follow_the_optimizer_rules() {
        let (a, b) = (host(&[1.0, 4.0]), host(&[2.0, 2.0]));
        assert_eq!(a.plus(&b).unwrap().to_vec().unwrap(), vec![3.0, 6.0]);
        assert_eq!(a.minus(&b).unwrap().to_vec().unwrap(), vec![-1.0, 2.0]);
        assert_eq!(a.divide(&b).unwrap().to_vec().unwrap(), vec![0.5, 2.0]);
        assert_eq!(a.root().unwrap().to_vec().unwrap(), vec![1.0, 2.0]);
        assert_eq!(
            a.affine(2.0, 1.0).unwrap().to_vec().unwrap(),
            vec![3.0, 9.0]
        );
        assert_eq!(a.sum_of_squares().unwrap(), 17.0);
        let e = a.plus(&host(&[1.0])).err().unwrap().to_string();
        assert!(e.contains("2 and 1 values"), "{e}");
    }

    /// A device vector gives the host vector's values, operation by operation.
    #[cfg(feature = "torch")]
    #[test]
    fn tch_vectors_give_the_host_vectors_values() {
        let home = FlatHome::Tch(tch::Device::Cpu, tch::Kind::Float);
        let (a, b) = ([1.5f32, -4.0, 9.0], [2.0f32, 0.5, 3.0]);
        let (ha, hb) = (host(&a), host(&b));
        let (ta, tb) = (
            home.place(a.to_vec()).unwrap(),
            home.place(b.to_vec()).unwrap(),
        );
        assert!(matches!(ta, Flat::Tch(_)));
        let same = |x: Flat, y: Flat| assert_eq!(x.to_vec().unwrap(), y.to_vec().unwrap());
        same(ha.plus(&hb).unwrap(), ta.plus(&tb).unwrap());
        same(ha.minus(&hb).unwrap(), ta.minus(&tb).unwrap());
        same(ha.divide(&hb).unwrap(), ta.divide(&tb).unwrap());
        same(ha.square().unwrap(), ta.square().unwrap());
        same(ha.affine(0.5, 0.0).unwrap(), ta.affine(0.5, 0.0).unwrap());
        same(
            ha.duplicate().padded(5).unwrap(),
            ta.duplicate().padded(5).unwrap(),
        );
        same(ha.slice(1..3).unwrap(), ta.slice(1..3).unwrap());
        same(
            ha.duplicate().truncated(2).unwrap(),
            ta.duplicate().truncated(2).unwrap(),
        );
        assert_eq!(ha.sum_of_squares().unwrap(), ta.sum_of_squares().unwrap());
        let parts = vec![ta.duplicate(), host(&[7.0])];
        let cat = Flat::concat(parts, home).unwrap();
        assert_eq!(cat.home(), home);
        assert_eq!(cat.to_vec().unwrap(), vec![1.5, -4.0, 9.0, 7.0]);
        let e = ta.plus(&hb).err().unwrap().to_string();
        assert!(e.contains("host vector and a device tensor"), "{e}");
        assert!(!ta.has_non_finite().unwrap());
        assert!(home
            .place(vec![f32::INFINITY])
            .unwrap()
            .has_non_finite()
            .unwrap());
    }
}
