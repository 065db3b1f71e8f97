//! Flat f32 vectors where sharded data parallel keeps a unit's parameters, gradients and optimizer slots
//! (`strategy::fsdp`), placed where the engine computes: host memory for Candle, a 1-D tensor on the
//! engine's device for tch. On a GPU the slices, the all-gathers and reduce-scatters (NCCL) and the
//! sharded optimizer's arithmetic then stay on the device, as PyTorch FSDP's flat parameters do; a
//! unit crosses to the host only for a checkpoint.

use super::optim::OptTensor;

/// A flat f32 vector, in host memory or on a tch device.
pub enum Flat {
    Host(Vec<f32>),
    #[cfg(feature = "torch")]
    Tch(tch::Tensor),
}

/// Where an engine wants its flat vectors (`Engine::flat_home`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlatHome {
    Host,
    #[cfg(feature = "torch")]
    Tch(tch::Device),
}

impl FlatHome {
    /// `values` placed here.
    pub fn place(self, values: Vec<f32>) -> anyhow::Result<Flat> {
        match self {
            FlatHome::Host => Ok(Flat::Host(values)),
            #[cfg(feature = "torch")]
            FlatHome::Tch(device) => {
                Ok(Flat::Tch(tch::Tensor::f_from_slice(&values)?.f_to(device)?))
            }
        }
    }

    /// `len` zeros placed here.
    pub fn zeros(self, len: usize) -> anyhow::Result<Flat> {
        match self {
            FlatHome::Host => Ok(Flat::Host(vec![0.0; len])),
            #[cfg(feature = "torch")]
            FlatHome::Tch(device) => Ok(Flat::Tch(tch::Tensor::f_zeros(
                [len as i64],
                (tch::Kind::Float, device),
            )?)),
        }
    }
}

/// The two sides of a binary operation, which must live in the same place.
enum Pair<'a> {
    Host(&'a [f32], &'a [f32]),
    #[cfg(feature = "torch")]
    Tch(&'a tch::Tensor, &'a tch::Tensor),
}

impl Flat {
    pub fn len(&self) -> usize {
        match self {
            Flat::Host(v) => v.len(),
            #[cfg(feature = "torch")]
            Flat::Tch(t) => t.numel(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn home(&self) -> FlatHome {
        match self {
            Flat::Host(_) => FlatHome::Host,
            #[cfg(feature = "torch")]
            Flat::Tch(t) => FlatHome::Tch(t.device()),
        }
    }

    /// The values in host memory (a copy from a device).
    pub fn to_vec(&self) -> anyhow::Result<Vec<f32>> {
        match self {
            Flat::Host(v) => Ok(v.clone()),
            #[cfg(feature = "torch")]
            Flat::Tch(t) => Ok(Vec::<f32>::try_from(
                &t.f_detach()?
                    .f_to_kind(tch::Kind::Float)?
                    .f_to(tch::Device::Cpu)?
                    .f_contiguous()?,
            )?),
        }
    }

    /// Values `range` (a view on a device).
    pub fn slice(&self, range: std::ops::Range<usize>) -> anyhow::Result<Flat> {
        anyhow::ensure!(
            range.end <= self.len(),
            "flat vector of {} values sliced at {range:?}",
            self.len()
        );
        match self {
            Flat::Host(v) => Ok(Flat::Host(v[range].to_vec())),
            #[cfg(feature = "torch")]
            Flat::Tch(t) => Ok(Flat::Tch(t.f_narrow(
                0,
                range.start as i64,
                range.len() as i64,
            )?)),
        }
    }

    /// The first `len` values (a view on a device; the host vector shortened in place).
    pub fn truncated(self, len: usize) -> anyhow::Result<Flat> {
        match self {
            Flat::Host(mut v) => {
                anyhow::ensure!(
                    len <= v.len(),
                    "flat vector of {} values cut at {len}",
                    v.len()
                );
                v.truncate(len);
                Ok(Flat::Host(v))
            }
            #[cfg(feature = "torch")]
            tch @ Flat::Tch(_) => tch.slice(0..len),
        }
    }

    /// This vector followed by zeros up to `len` values.
    pub fn padded(self, len: usize) -> anyhow::Result<Flat> {
        anyhow::ensure!(
            len >= self.len(),
            "cannot pad {} values to {len}",
            self.len()
        );
        if len == self.len() {
            return Ok(self);
        }
        match self {
            Flat::Host(mut v) => {
                v.resize(len, 0.0);
                Ok(Flat::Host(v))
            }
            #[cfg(feature = "torch")]
            Flat::Tch(t) => {
                let pad = (len - t.numel()) as i64;
                Ok(Flat::Tch(t.f_constant_pad_nd([0, pad])?))
            }
        }
    }

    /// The parts one after the other; `home` when there are none.
    pub fn concat(parts: Vec<Flat>, home: FlatHome) -> anyhow::Result<Flat> {
        let mut parts = parts.into_iter().filter(|p| !p.is_empty()).peekable();
        let Some(first) = parts.peek() else {
            return home.zeros(0);
        };
        match first.home() {
            FlatHome::Host => {
                let mut all = Vec::new();
                for p in parts {
                    all.extend(p.into_host()?);
                }
                Ok(Flat::Host(all))
            }
            #[cfg(feature = "torch")]
            FlatHome::Tch(device) => {
                let tensors = parts
                    .map(|p| match p {
                        Flat::Tch(t) => Ok(t),
                        Flat::Host(v) => Ok(tch::Tensor::f_from_slice(&v)?.f_to(device)?),
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?;
                Ok(Flat::Tch(tch::Tensor::f_cat(&tensors, 0)?))
            }
        }
    }

    /// The values in host memory: borrowed when they are there already.
    pub fn host_values(&self) -> anyhow::Result<std::borrow::Cow<'_, [f32]>> {
        match self {
            Flat::Host(v) => Ok(std::borrow::Cow::Borrowed(v)),
            #[cfg(feature = "torch")]
            Flat::Tch(_) => Ok(std::borrow::Cow::Owned(self.to_vec()?)),
        }
    }

    /// The values in host memory, moved when they are there already.
    pub fn into_host(self) -> anyhow::Result<Vec<f32>> {
        match self {
            Flat::Host(v) => Ok(v),
            #[cfg(feature = "torch")]
            flat @ Flat::Tch(_) => flat.to_vec(),
        }
    }

    /// Does any value hold an inf or a NaN?
    pub fn has_non_finite(&self) -> anyhow::Result<bool> {
        match self {
            Flat::Host(v) => Ok(v.iter().any(|x| !x.is_finite())),
            #[cfg(feature = "torch")]
            Flat::Tch(t) => Ok(t.f_isfinite()?.f_all()?.f_int64_value(&[])? == 0),
        }
    }

    fn pair<'a>(&'a self, other: &'a Flat) -> anyhow::Result<Pair<'a>> {
        anyhow::ensure!(
            self.len() == other.len(),
            "flat vectors of {} and {} values",
            self.len(),
            other.len()
        );
        match (self, other) {
            (Flat::Host(a), Flat::Host(b)) => Ok(Pair::Host(a, b)),
            #[cfg(feature = "torch")]
            (Flat::Tch(a), Flat::Tch(b)) => Ok(Pair::Tch(a, b)),
            #[cfg(feature = "torch")]
            _ => anyhow::bail!("a host vector and a device tensor in one operation"),
        }
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
        match self {
            Flat::Host(v) => Flat::Host(v.clone()),
            #[cfg(feature = "torch")]
            Flat::Tch(t) => Flat::Tch(t.shallow_clone()),
        }
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
    fn sum_of_squares(&self) -> anyhow::Result<f64> {
        match self {
            Flat::Host(v) => Ok(v.iter().map(|&a| f64::from(a) * f64::from(a)).sum()),
            #[cfg(feature = "torch")]
            Flat::Tch(t) => OptTensor::sum_of_squares(t),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn pads_slices_and_concatenates() {
        let v = host(&[1.0, 2.0]).padded(4).unwrap();
        assert_eq!(v.to_vec().unwrap(), vec![1.0, 2.0, 0.0, 0.0]);
        assert_eq!(v.slice(1..3).unwrap().to_vec().unwrap(), vec![2.0, 0.0]);
        assert_eq!(v.truncated(1).unwrap().to_vec().unwrap(), vec![1.0]);
        assert!(host(&[1.0]).truncated(2).is_err());
        let all = Flat::concat(
            vec![host(&[1.0]), host(&[]), host(&[2.0, 3.0])],
            FlatHome::Host,
        );
        assert_eq!(all.unwrap().to_vec().unwrap(), vec![1.0, 2.0, 3.0]);
        assert!(Flat::concat(Vec::new(), FlatHome::Host).unwrap().is_empty());
        assert!(host(&[1.0, f32::NAN]).has_non_finite().unwrap());
        assert!(!host(&[1.0]).has_non_finite().unwrap());
    }

    /// A device vector gives the host vector's values, operation by operation.
    #[cfg(feature = "torch")]
    #[test]
    fn tch_vectors_give_the_host_vectors_values() {
        let home = FlatHome::Tch(tch::Device::Cpu);
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
