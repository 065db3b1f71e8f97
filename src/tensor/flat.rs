//! Flat vectors, placed where the engine computes: host memory for Candle, a 1-D tensor on the engine's
//! device for tch. They are what moves between an engine, a strategy and the collectives: the gradients
//! DDP averages (in buckets), and the unit slices, gradients and optimizer slots FSDP keeps. On a GPU the
//! values, the collectives (NCCL) and the sharded optimizer's arithmetic then stay on the device, as
//! PyTorch's DDP buckets and FSDP's flat parameters do; they cross to the host only for a checkpoint.
//!
//! The values are f32, except gradients of models stored in 16 bits (`bf16-true`, `16-true`), which keep
//! their dtype as libtorch's DDP reduces them.

/// A flat vector, in host memory or on a tch device.
pub enum Flat {
    Host(Vec<f32>),
    #[cfg(feature = "torch")]
    Tch(tch::Tensor),
}

/// Where flat vectors live: host memory, or a tch device with the vectors' dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlatHome {
    Host,
    #[cfg(feature = "torch")]
    Tch(tch::Device, tch::Kind),
}

impl FlatHome {
    /// `values` placed here.
    pub fn place(self, values: Vec<f32>) -> anyhow::Result<Flat> {
        match self {
            FlatHome::Host => Ok(Flat::Host(values)),
            #[cfg(feature = "torch")]
            FlatHome::Tch(device, kind) => Ok(Flat::Tch(
                tch::Tensor::f_from_slice(&values)?
                    .f_to_kind(kind)?
                    .f_to(device)?,
            )),
        }
    }

    /// `len` zeros placed here.
    pub fn zeros(self, len: usize) -> anyhow::Result<Flat> {
        match self {
            FlatHome::Host => Ok(Flat::Host(vec![0.0; len])),
            #[cfg(feature = "torch")]
            FlatHome::Tch(device, kind) => Ok(Flat::Tch(tch::Tensor::f_zeros(
                [len as i64],
                (kind, device),
            )?)),
        }
    }
}

/// The two sides of a binary operation, which must live in the same place.
pub enum Pair<'a> {
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
            Flat::Tch(t) => FlatHome::Tch(t.device(), t.kind()),
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
        let refs: Vec<&Flat> = parts.iter().collect();
        Flat::concat_refs(&refs, home)
    }

    /// The parts one after the other (a new vector; the parts are left as they are), in the place and
    /// dtype of the first non-empty part; `home` when there are none.
    pub fn concat_refs(parts: &[&Flat], home: FlatHome) -> anyhow::Result<Flat> {
        let mut parts = parts.iter().filter(|p| !p.is_empty()).peekable();
        let Some(first) = parts.peek() else {
            return home.zeros(0);
        };
        match first.home() {
            FlatHome::Host => {
                let mut all = Vec::new();
                for p in parts {
                    all.extend_from_slice(&p.host_values()?);
                }
                Ok(Flat::Host(all))
            }
            #[cfg(feature = "torch")]
            FlatHome::Tch(device, kind) => {
                let tensors = parts
                    .map(|p| match p {
                        Flat::Tch(t) => Ok(t.shallow_clone()),
                        Flat::Host(v) => Ok(tch::Tensor::f_from_slice(v)?
                            .f_to_kind(kind)?
                            .f_to(device)?),
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?;
                Ok(Flat::Tch(tch::Tensor::f_cat(&tensors, 0)?))
            }
        }
    }

    /// Another handle on the values: the same device tensor, or a copy of a host vector.
    pub fn handle(&self) -> Flat {
        match self {
            Flat::Host(v) => Flat::Host(v.clone()),
            #[cfg(feature = "torch")]
            Flat::Tch(t) => Flat::Tch(t.shallow_clone()),
        }
    }

    /// Overwrite the values with `src`'s, in place (a device tensor converts `src` to its dtype and
    /// device: every view of it sees the new values).
    pub fn copy_from(&mut self, src: &Flat) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.len() == src.len(),
            "copying {} values into a flat vector of {}",
            src.len(),
            self.len()
        );
        match self {
            Flat::Host(dst) => dst.copy_from_slice(&src.host_values()?),
            #[cfg(feature = "torch")]
            Flat::Tch(dst) => {
                let src = match src {
                    Flat::Tch(t) => t.shallow_clone(),
                    Flat::Host(v) => tch::Tensor::f_from_slice(v)?,
                };
                tch::no_grad(|| dst.f_copy_(&src))?;
            }
        }
        Ok(())
    }

    /// Divide every value by `divisor`, in place.
    pub fn divide_in_place(&mut self, divisor: f64) -> anyhow::Result<()> {
        match self {
            Flat::Host(v) => {
                let d = divisor as f32;
                v.iter_mut().for_each(|x| *x /= d);
            }
            #[cfg(feature = "torch")]
            Flat::Tch(t) => {
                let _ = tch::no_grad(|| t.f_div_scalar_(divisor))?;
            }
        }
        Ok(())
    }

    /// The same values in f32 (no copy when they are f32 already).
    pub fn into_f32(self) -> anyhow::Result<Flat> {
        match self {
            Flat::Host(v) => Ok(Flat::Host(v)),
            #[cfg(feature = "torch")]
            Flat::Tch(t) if t.kind() == tch::Kind::Float => Ok(Flat::Tch(t)),
            #[cfg(feature = "torch")]
            Flat::Tch(t) => Ok(Flat::Tch(t.f_to_kind(tch::Kind::Float)?)),
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

    /// Both vectors, checked to be of one length and in one place.
    pub fn pair<'a>(&'a self, other: &'a Flat) -> anyhow::Result<Pair<'a>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn host(v: &[f32]) -> Flat {
        Flat::Host(v.to_vec())
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
}
