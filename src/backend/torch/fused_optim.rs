//! The optimizer rules of `optim`, applied in place on libtorch tensors with its multi-tensor kernels
//! (`_foreach_*`, through the C++ shim: PyTorch's default `foreach=True` optimizers): the same operations
//! on the same operands in the same order (so the same numbers, bit for bit), written into the optimizer
//! state, the gradient (a scratch buffer once the step has read it) and the parameter, a few launches for
//! the whole model. The generic rules allocate four or five parameter-sized tensors per parameter and
//! step; one launch per parameter and operation was most of a small model's GPU step. `optim` stays the
//! reference (Candle uses it; the tests below check this path against it). After the step the gradients
//! are dropped, not zeroed, as PyTorch's `zero_grad(set_to_none=True)`.

use crate::optim::Optimizer;
use crate::schema::OptimizerName;
use tch::Tensor;

extern "C" {
    fn trainyard_sgd_foreach(
        params: *const *mut std::ffi::c_void,
        grads: *const *mut std::ffi::c_void,
        bufs: *const *mut std::ffi::c_void,
        n: i64,
        lr: f64,
        momentum: f64,
        weight_decay: f64,
        nesterov: std::os::raw::c_int,
        update_bufs: std::os::raw::c_int,
    ) -> std::os::raw::c_int;
    fn trainyard_adam_foreach(
        params: *const *mut std::ffi::c_void,
        grads: *const *mut std::ffi::c_void,
        exp_avg: *const *mut std::ffi::c_void,
        exp_avg_sq: *const *mut std::ffi::c_void,
        n: i64,
        lr: f64,
        beta1: f64,
        beta2: f64,
        eps: f64,
        weight_decay: f64,
        decoupled: std::os::raw::c_int,
        bc1: f64,
        bc2: f64,
        update_state: std::os::raw::c_int,
    ) -> std::os::raw::c_int;
    fn trainyard_foreach_mul_(
        ts: *const *mut std::ffi::c_void,
        n: i64,
        k: f64,
    ) -> std::os::raw::c_int;
    fn trainyard_grad_reset(t: *mut std::ffi::c_void) -> std::os::raw::c_int;
    fn trainyard_grad_set(
        t: *mut std::ffi::c_void,
        g: *const std::ffi::c_void,
    ) -> std::os::raw::c_int;
}

/// `p.grad = None`: the next backward hands its gradient buffer over instead of adding it into a zeroed
/// one (a fill and a read-add-write pass per parameter and step saved; the values are the same).
pub fn clear_grad(p: &mut Tensor) -> anyhow::Result<()> {
    // SAFETY: `p` is a live tch handle, i.e. a `torch::Tensor*`; the shim catches C++ exceptions.
    let status = unsafe { trainyard_grad_reset(p.as_mut_ptr().cast()) };
    anyhow::ensure!(status == 0, "libtorch refused to drop a gradient");
    Ok(())
}

/// `p.grad = g` (`g` of `p`'s shape; it becomes the gradient, no copy).
pub fn set_grad(p: &mut Tensor, g: &Tensor) -> anyhow::Result<()> {
    // SAFETY: live tch handles (`torch::Tensor*`); the shim checks the shapes and catches C++ exceptions.
    let status = unsafe { trainyard_grad_set(p.as_mut_ptr().cast(), g.as_ptr().cast()) };
    anyhow::ensure!(
        status == 0,
        "libtorch refused a gradient of shape {:?} for a parameter of shape {:?}",
        g.size(),
        p.size()
    );
    Ok(())
}

/// `t ← t·k` for every tensor, in one multi-tensor launch (skipped for k = 1).
pub fn scale_all(ts: &mut [Tensor], k: f64) -> anyhow::Result<()> {
    if k == 1.0 || ts.is_empty() {
        return Ok(());
    }
    let handles: Vec<_> = ts.iter_mut().map(|t| t.as_mut_ptr().cast()).collect();
    // SAFETY: live tch handles (`torch::Tensor*`), n of them; the shim catches C++ exceptions.
    let status = unsafe { trainyard_foreach_mul_(handles.as_ptr(), handles.len() as i64, k) };
    anyhow::ensure!(status == 0, "libtorch refused to scale the gradients");
    Ok(())
}

/// A registered optimizer's step (`optim::Optimizer::update`), parameter by parameter, written into the
/// parameters in place. Its state may keep the gradient it is given, so it gets a copy: a `.grad` can be
/// a view of a DDP bucket the next backward pass writes into. Call under `tch::no_grad`.
pub fn each_param(
    opt: &mut Optimizer<Tensor>,
    names: &[String],
    params: &mut [Tensor],
    grads: &[Tensor],
    lr: f64,
    momentum: Option<f64>,
) -> anyhow::Result<()> {
    for ((name, p), g) in names.iter().zip(params.iter_mut()).zip(grads) {
        let new = opt.update(name, p, &g.f_detach_copy()?, lr, momentum)?;
        anyhow::ensure!(
            new.size() == p.size(),
            "the optimizer's rule gave parameter '{name}' the shape {:?}, it has {:?}",
            new.size(),
            p.size()
        );
        p.f_copy_(&new.f_to_kind(p.kind())?)?;
    }
    Ok(())
}

/// One SGD step over every parameter at once, with libtorch's multi-tensor kernels (`_foreach_*`, as
/// PyTorch's default `foreach=True` SGD): on a GPU a handful of launches for the model instead of four
/// or five per parameter, which is most of a small model's step. The operations and their rounding are
/// `optim`'s SGD rule's, so the numbers are the same bit for bit. `params[i]` (detached handles) pairs
/// with `grads[i]` (scratch) and `names[i]`. Call under `tch::no_grad`.
pub fn sgd_all(
    opt: &mut Optimizer<Tensor>,
    names: &[String],
    params: &mut [Tensor],
    grads: &mut [Tensor],
    lr: f64,
    momentum: Option<f64>,
) -> anyhow::Result<()> {
    let o = &opt.config;
    anyhow::ensure!(o.name == OptimizerName::Sgd, "sgd_all runs SGD only");
    let m = momentum.filter(|_| o.momentum != 0.0).unwrap_or(o.momentum);
    let (weight_decay, nesterov) = (o.weight_decay, std::os::raw::c_int::from(o.nesterov));
    let handle = |t: &mut Tensor| -> *mut std::ffi::c_void { t.as_mut_ptr().cast() };
    // Two groups: parameters whose momentum buffer exists (updated by the step) and those whose buffer
    // is new (the step fills it with the weight-decayed gradient, as PyTorch's first step).
    let (mut old, mut fresh) = (Group::default(), Group::default());
    for ((name, p), g) in names.iter().zip(params.iter_mut()).zip(grads.iter_mut()) {
        let group = if m == 0.0 {
            &mut old
        } else {
            let key = format!("{name}.momentum_buffer");
            let (buf, group) = match opt.state.entry(key) {
                std::collections::btree_map::Entry::Occupied(slot) => (slot.into_mut(), &mut old),
                std::collections::btree_map::Entry::Vacant(slot) => {
                    (slot.insert(g.f_empty_like()?), &mut fresh)
                }
            };
            group.bufs.push(handle(buf));
            group
        };
        group.params.push(handle(p));
        group.grads.push(handle(g));
    }
    for (group, update_bufs) in [(old, 1), (fresh, 0)] {
        if group.params.is_empty() {
            continue;
        }
        let bufs = if m == 0.0 {
            std::ptr::null()
        } else {
            group.bufs.as_ptr()
        };
        // SAFETY: live tch handles, `n` in each list (`bufs` too when momentum is on); the buffers are
        // owned by `opt.state`, which is not touched while the shim runs; it catches C++ exceptions.
        let status = unsafe {
            trainyard_sgd_foreach(
                group.params.as_ptr(),
                group.grads.as_ptr(),
                bufs,
                group.params.len() as i64,
                lr,
                m,
                weight_decay,
                nesterov,
                update_bufs,
            )
        };
        anyhow::ensure!(status == 0, "libtorch's multi-tensor SGD step failed");
    }
    Ok(())
}

/// One Adam/AdamW step over every parameter at once with libtorch's multi-tensor kernels (as `sgd_all`
/// for SGD): `optim`'s Adam rule, the same operations and rounding, so the same numbers bit for bit.
/// Call under `tch::no_grad`, before `opt.steps` counts this step.
pub fn adam_all(
    opt: &mut Optimizer<Tensor>,
    names: &[String],
    params: &mut [Tensor],
    grads: &mut [Tensor],
    lr: f64,
) -> anyhow::Result<()> {
    let o = &opt.config;
    anyhow::ensure!(
        matches!(o.name, OptimizerName::Adam | OptimizerName::Adamw),
        "adam_all runs Adam and AdamW only"
    );
    let (b1, b2) = (o.betas[0], o.betas[1]);
    let t = opt.steps as i32 + 1;
    let (bc1, bc2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
    let (eps, weight_decay) = (o.eps, o.weight_decay);
    let decoupled = std::os::raw::c_int::from(o.name == OptimizerName::Adamw);
    let handle = |t: &mut Tensor| -> *mut std::ffi::c_void { t.as_mut_ptr().cast() };
    // Parameters whose moments exist, and those whose moments are new (the step fills them).
    let (mut old, mut fresh) = (Group::default(), Group::default());
    for ((name, p), g) in names.iter().zip(params.iter_mut()).zip(grads.iter_mut()) {
        let (km, kv) = (format!("{name}.exp_avg"), format!("{name}.exp_avg_sq"));
        let group = if opt.state.contains_key(&km) && opt.state.contains_key(&kv) {
            &mut old
        } else {
            opt.state.insert(km.clone(), g.f_empty_like()?);
            opt.state.insert(kv.clone(), g.f_empty_like()?);
            &mut fresh
        };
        // The handles are libtorch's heap tensors: they stay put when the map moves its entries.
        group
            .bufs
            .push(handle(opt.state.get_mut(&km).expect("inserted above")));
        group
            .bufs2
            .push(handle(opt.state.get_mut(&kv).expect("inserted above")));
        group.params.push(handle(p));
        group.grads.push(handle(g));
    }
    for (group, update_state) in [(old, 1), (fresh, 0)] {
        if group.params.is_empty() {
            continue;
        }
        // SAFETY: live tch handles, `n` in each list; the moments are owned by `opt.state`, untouched
        // while the shim runs; it catches C++ exceptions.
        let status = unsafe {
            trainyard_adam_foreach(
                group.params.as_ptr(),
                group.grads.as_ptr(),
                group.bufs.as_ptr(),
                group.bufs2.as_ptr(),
                group.params.len() as i64,
                lr,
                b1,
                b2,
                eps,
                weight_decay,
                decoupled,
                bc1,
                bc2,
                update_state,
            )
        };
        anyhow::ensure!(status == 0, "libtorch's multi-tensor Adam step failed");
    }
    Ok(())
}

/// The handles one multi-tensor optimizer call takes (`bufs`: SGD's momentum or Adam's first moment;
/// `bufs2`: Adam's second moment).
#[derive(Default)]
struct Group {
    params: Vec<*mut std::ffi::c_void>,
    grads: Vec<*mut std::ffi::c_void>,
    bufs: Vec<*mut std::ffi::c_void>,
    bufs2: Vec<*mut std::ffi::c_void>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::OptimizerConfig;
    use tch::{Device, Kind};

    fn config(yaml: &str) -> OptimizerConfig {
        let node = crate::config::yaml::parse(yaml, "<test>").unwrap().unwrap();
        serde_json::from_value(node.to_json()).unwrap()
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        let flat = t.f_flatten(0, -1).unwrap();
        Vec::<f32>::try_from(&flat)
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    }

    /// Four steps on three random tensors, the generic rules vs the multi-tensor step over all of them
    /// at once, with the OneCycle momentum override on some steps; the last tensor has no gradient in the
    /// first step, so a later step mixes parameters whose state exists with one whose state is new.
    /// Parameters and state equal bit for bit.
    fn same_as_rules(yaml: &str) {
        tch::manual_seed(7);
        let shapes: [&[i64]; 3] = [&[5, 3, 3, 3], &[17], &[10, 33]];
        let params: Vec<Tensor> = shapes
            .iter()
            .map(|s| Tensor::randn(*s, (Kind::Float, Device::Cpu)))
            .collect();
        let mut reference: Vec<Tensor> = params.iter().map(|p| p.copy()).collect();
        let fused: Vec<Tensor> = params.iter().map(|p| p.copy()).collect();
        let mut rules = Optimizer::<Tensor>::new(config(yaml));
        let mut fast = Optimizer::<Tensor>::new(config(yaml));
        for step in 0..4 {
            let lr = 0.05 / (step + 1) as f64;
            let momentum = (step % 2 == 1).then_some(0.85);
            let (mut names, mut ps, mut gs) = (Vec::new(), Vec::new(), Vec::new());
            for (i, s) in shapes.iter().enumerate() {
                if step == 0 && i == 2 {
                    continue;
                }
                let g = Tensor::randn(*s, (Kind::Float, Device::Cpu));
                let name = format!("p{i}");
                reference[i] = rules
                    .update(&name, &reference[i], &g, lr, momentum)
                    .unwrap();
                names.push(name);
                ps.push(fused[i].shallow_clone());
                gs.push(g.copy());
            }
            if fast.config.name == OptimizerName::Sgd {
                sgd_all(&mut fast, &names, &mut ps, &mut gs, lr, momentum).unwrap();
            } else {
                adam_all(&mut fast, &names, &mut ps, &mut gs, lr).unwrap();
            }
            rules.steps += 1;
            fast.steps += 1;
        }
        for (i, (r, f)) in reference.iter().zip(&fused).enumerate() {
            assert_eq!(bits(r), bits(f), "{yaml}: parameter {i}");
        }
        assert_eq!(
            rules.state.keys().collect::<Vec<_>>(),
            fast.state.keys().collect::<Vec<_>>()
        );
        for (key, r) in &rules.state {
            assert_eq!(bits(r), bits(&fast.state[key]), "{yaml}: state {key}");
        }
    }

    #[rstest::rstest]
    #[case("{name: sgd, lr: 0.1}")]
    #[case("{name: sgd, lr: 0.1, momentum: 0.9}")]
    #[case("{name: sgd, lr: 0.1, momentum: 0.9, weight_decay: 0.0005}")]
    #[case("{name: sgd, lr: 0.1, momentum: 0.9, nesterov: true, weight_decay: 0.01}")]
    #[case("{name: sgd, lr: 0.1, weight_decay: 0.01}")]
    #[case("{name: sgd, lr: 0.1, momentum: 1.0, weight_decay: 1.0}")]
    fn sgd_matches_the_rules(#[case] yaml: &str) {
        same_as_rules(yaml);
    }

    #[rstest::rstest]
    #[case("{name: adam, lr: 0.001, betas: [0.9, 0.999], eps: 1e-8}")]
    #[case("{name: adam, lr: 0.001, weight_decay: 0.01}")]
    #[case("{name: adamw, lr: 0.001, weight_decay: 0.05, betas: [0.8, 0.99]}")]
    #[case("{name: adamw, lr: 1.0, weight_decay: 0.0, betas: [0.0, 0.0], eps: 0.0}")]
    fn adam_and_adamw_match_the_rules(#[case] yaml: &str) {
        same_as_rules(yaml);
    }
}
