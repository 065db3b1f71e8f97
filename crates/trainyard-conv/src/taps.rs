//! Which kernel taps each output pixel of a gather reads, and where: pixels are grouped by the taps that
//! land inside the source, so a group's register tiles share one tap list and no tap reads padding. The
//! forward pass and the input gradient then need no padded copy and spend no products on its zeros (at
//! ResNet's 4 × 4 layers a third of a padded 3 × 3 gather's products are zeros), and the strided input
//! gradient becomes a gather (each input pixel summed once over the output pixels that read it) instead
//! of a scatter that adds into every input pixel once per tap. oneDNN's kernels bound their tap loops at
//! the borders the same way.

/// Output coordinates along one axis that read the same taps at the same relative source offsets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AxisGroup {
    /// (tap along this axis, source coordinate relative to the group member's base), in source order, so
    /// a pixel's reads run forward through memory (the input gradient's taps run backward).
    pub taps: Vec<(usize, usize)>,
    /// (output coordinate, its base source coordinate).
    pub coords: Vec<(usize, usize)>,
}

/// Groups the `out_len` output coordinates of one axis by the taps they read: `source(y, t)` is the source
/// coordinate tap `t` of output `y` reads, or `None` where it falls outside the source. Groups come in the
/// order their first coordinate appears; a coordinate no tap reaches gets a group with no taps.
pub(crate) fn axis_groups(
    out_len: usize,
    k: usize,
    source: impl Fn(usize, usize) -> Option<usize>,
) -> Vec<AxisGroup> {
    let mut groups: Vec<AxisGroup> = Vec::new();
    for y in 0..out_len {
        let mut reads: Vec<(usize, usize)> =
            (0..k).filter_map(|t| Some((t, source(y, t)?))).collect();
        reads.sort_by_key(|&(_, s)| s);
        let base = reads.iter().map(|&(_, s)| s).min().unwrap_or(0);
        let taps: Vec<(usize, usize)> = reads.iter().map(|&(t, s)| (t, s - base)).collect();
        match groups.iter_mut().find(|g| g.taps == taps) {
            Some(group) => group.coords.push((y, base)),
            None => groups.push(AxisGroup {
                taps,
                coords: vec![(y, base)],
            }),
        }
    }
    groups
}

/// The forward pass along one axis: output `y` reads input `y·stride + t − padding`.
pub(crate) fn forward_axis(out_len: usize, (len, k, stride, padding): Axis) -> Vec<AxisGroup> {
    axis_groups(out_len, k, |y, t| {
        (y * stride + t).checked_sub(padding).filter(|&i| i < len)
    })
}

/// The input gradient along one axis: input `i` (of `in_len`) receives from output `o` through tap `t`
/// where `o·stride + t − padding = i`, for the `out_len` outputs.
pub(crate) fn input_grad_axis(
    in_len: usize,
    (out_len, k, stride, padding): Axis,
) -> Vec<AxisGroup> {
    axis_groups(in_len, k, |i, t| {
        let d = (i + padding).checked_sub(t)?;
        (d % stride == 0 && d / stride < out_len).then_some(d / stride)
    })
}

/// Output pixels that read the same taps: a row group crossed with a column group.
pub(crate) struct PixelGroup {
    /// (tap index kh·k + kw, source offset from a pixel's base), offsets in f32s.
    pub taps: Vec<(usize, usize)>,
    /// The group's pixels in one image: (source offset of the pixel's base, output offset).
    pub px: Vec<(usize, usize)>,
}

/// Every row group crossed with every column group, for blocked planes of `l` lanes that are `src_w`
/// pixels wide in the source and `out_w` in the output, and a `k`-wide kernel.
pub(crate) fn pixel_groups(
    (rows, cols): (&[AxisGroup], &[AxisGroup]),
    (src_w, out_w): (usize, usize),
    (k, l): (usize, usize),
) -> Vec<PixelGroup> {
    let cross = |r: &AxisGroup, c: &AxisGroup| PixelGroup {
        taps: (r.taps.iter())
            .flat_map(|&(kh, dy)| {
                (c.taps.iter()).map(move |&(kw, dx)| (kh * k + kw, (dy * src_w + dx) * l))
            })
            .collect(),
        px: (r.coords.iter())
            .flat_map(|&(y, sy)| {
                (c.coords.iter()).map(move |&(x, sx)| ((sy * src_w + sx) * l, (y * out_w + x) * l))
            })
            .collect(),
    };
    (rows.iter())
        .flat_map(|r| cols.iter().map(move |c| cross(r, c)))
        .collect()
}

/// One axis of a convolution: (source length, kernel size, stride, padding).
pub(crate) type Axis = (usize, usize, usize, usize);

#[cfg(test)]
mod tests {
    use super::*;

    fn taps(groups: &[AxisGroup]) -> Vec<Vec<(usize, usize)>> {
        groups.iter().map(|g| g.taps.clone()).collect()
    }

    #[test]
    fn a_padded_3x3_forward_has_two_borders_and_an_interior() {
        let groups = forward_axis(4, (4, 3, 1, 1));
        assert_eq!(
            taps(&groups),
            [
                vec![(1, 0), (2, 1)],
                vec![(0, 0), (1, 1), (2, 2)],
                vec![(0, 0), (1, 1)]
            ]
        );
        assert_eq!(groups[0].coords, [(0, 0)]);
        assert_eq!(groups[1].coords, [(1, 0), (2, 1)]);
        assert_eq!(groups[2].coords, [(3, 2)]);
    }

    #[test]
    fn a_stride_2_input_gradient_splits_by_parity() {
        // 8 inputs, 4 outputs, 3 taps, padding 1: even inputs read tap 1 only; odd ones taps 0 and 2, but
        // the last reads tap 2 alone (tap 0 would need output 4).
        let groups = input_grad_axis(8, (4, 3, 2, 1));
        assert_eq!(
            taps(&groups),
            [vec![(1, 0)], vec![(2, 0), (0, 1)], vec![(2, 0)]]
        );
        assert_eq!(groups[0].coords, [(0, 0), (2, 1), (4, 2), (6, 3)]);
        assert_eq!(groups[1].coords, [(1, 0), (3, 1), (5, 2)]);
        assert_eq!(groups[2].coords, [(7, 3)]);
    }

    #[test]
    fn inputs_a_strided_1x1_skips_get_no_taps() {
        let groups = input_grad_axis(5, (3, 1, 2, 0));
        assert_eq!(taps(&groups), [vec![(0, 0)], vec![]]);
        assert_eq!(groups[1].coords, [(1, 0), (3, 0)]);
    }
}
