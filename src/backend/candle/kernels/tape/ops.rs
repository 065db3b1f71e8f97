//! The Candle ops a model's body uses between the kernels' own (reshapes, transposes, residual and
//! broadcast adds, concatenation, dropout's mask), applied as Candle applies them and recorded on the
//! active tape with their backward, so a body built from them and the kernels stays on the tape.

use super::{record_candle, recording};
use candle_core::{Result, Shape, Tensor};

/// `g` summed down to `shape` (the broadcast `shape` went through undone), as Candle's own backward of a
/// broadcast sums: the leading dimensions and those of size 1 in `shape` in one reduction, then the
/// leading ones dropped.
pub fn sum_to(g: &Tensor, shape: &Shape) -> Result<Tensor> {
    if g.shape() == shape {
        return Ok(g.clone());
    }
    let lead = g.rank() - shape.rank();
    let mut dims: Vec<usize> = (0..lead).collect();
    for (d, (&node, &arg)) in g.dims()[lead..].iter().zip(shape.dims()).enumerate() {
        if node != arg {
            dims.push(d + lead);
        }
    }
    let mut g = g.sum_keepdim(dims)?;
    for _ in 0..lead {
        g = g.squeeze(0)?;
    }
    Ok(g)
}

/// `x.reshape(shape)`.
pub fn reshape<S: Into<Shape>>(x: &Tensor, shape: S) -> Result<Tensor> {
    let out = x.reshape(shape)?;
    if recording() {
        let dims = x.shape().clone();
        record_candle("reshape", &[x], &out, move |g| {
            Ok(vec![Some(g.reshape(dims.clone())?)])
        });
    }
    Ok(out)
}

/// `x.transpose(a, b)`.
pub fn transpose(x: &Tensor, a: usize, b: usize) -> Result<Tensor> {
    let out = x.transpose(a, b)?;
    record_candle("transpose", &[x], &out, move |g| {
        Ok(vec![Some(g.transpose(a, b)?)])
    });
    Ok(out)
}

/// `a + b`, broadcasting either side.
pub fn broadcast_add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let out = a.broadcast_add(b)?;
    if recording() {
        let (sa, sb) = (a.shape().clone(), b.shape().clone());
        record_candle("broadcast_add", &[a, b], &out, move |g| {
            Ok(vec![Some(sum_to(g, &sa)?), Some(sum_to(g, &sb)?)])
        });
    }
    Ok(out)
}

/// `x.broadcast_as(shape)`.
pub fn broadcast_as<S: Into<Shape>>(x: &Tensor, shape: S) -> Result<Tensor> {
    let out = x.broadcast_as(shape)?;
    if recording() {
        let sx = x.shape().clone();
        record_candle("broadcast_as", &[x], &out, move |g| {
            Ok(vec![Some(sum_to(g, &sx)?)])
        });
    }
    Ok(out)
}

/// `Tensor::cat(xs, dim)`.
pub fn cat(xs: &[&Tensor], dim: usize) -> Result<Tensor> {
    let out = Tensor::cat(xs, dim)?;
    if recording() {
        let sizes: Vec<usize> = xs.iter().map(|x| x.dim(dim)).collect::<Result<_>>()?;
        record_candle("cat", xs, &out, move |g| {
            let mut start = 0;
            let mut grads = Vec::with_capacity(sizes.len());
            for &len in &sizes {
                grads.push(Some(g.narrow(dim, start, len)?));
                start += len;
            }
            Ok(grads)
        });
    }
    Ok(out)
}

/// `x * mask` for a constant `mask` of `x`'s shape (dropout's): no gradient for the mask.
pub fn mul_by_constant(x: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let out = x.mul(mask)?;
    if recording() {
        let mask = mask.detach();
        record_candle("mul", &[x], &out, move |g| Ok(vec![Some(g.mul(&mask)?)]));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::candle::kernels::tape::record;
    use candle_core::{Device, Var};

    fn values(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    }

    /// Each op's recorded backward gives Candle's own gradients.
    #[test]
    fn recorded_backwards_equal_candles() {
        let dev = Device::Cpu;
        let a = Var::from_vec(
            (0..24).map(|i| i as f32 * 0.1 - 1.0).collect(),
            (2, 3, 4),
            &dev,
        )
        .unwrap();
        let bias = Var::from_vec(vec![0.5f32, -1.0, 2.0, 0.25], 4, &dev).unwrap();
        let row = Var::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], (1, 1, 4), &dev).unwrap();
        let mask =
            Tensor::from_vec((0..32).map(|i| (i % 3) as f32).collect(), (2, 16), &dev).unwrap();
        let body = || -> Result<Tensor> {
            let h = broadcast_add(a.as_tensor(), bias.as_tensor())?;
            let r = broadcast_as(row.as_tensor(), (2, 1, 4))?;
            let h = reshape(&transpose(&cat(&[&r, &h], 1)?, 1, 2)?, (2, 16))?;
            mul_by_constant(&h, &mask)
        };
        let seed =
            Tensor::from_vec((0..32).map(|i| (i as f32).sin()).collect(), (2, 16), &dev).unwrap();
        let reference = (body().unwrap() * &seed)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let (out, tape) = record(body).unwrap();
        assert!(tape.usable(&out));
        let grads = tape.backward(&out, seed).unwrap();
        for v in [&a, &bias, &row] {
            assert_eq!(
                values(grads.get(v.as_tensor()).unwrap()),
                values(reference.get(v.as_tensor()).unwrap())
            );
        }
    }
}
