//! Where a Candle train step spends its time: the whole step (forward + backward + SGD, as the trainer
//! runs it) and each CPU kernel of the small CNN on its own, forward and backward, at batch 64.
//!
//! usage: RAYON_NUM_THREADS=2 step_profile [cnn|resnet18-cifar|resnet50-64px|vit-tiny|vit-ops|resnet-convs|resnet-ops] [steps]

use candle_core::{Device, Tensor, Var};
use std::time::Instant;
use trainyard::backend::candle::kernels::{batchnorm, conv, conv_relu, direct, fused};
use trainyard::backend::candle::CandleEngine;
use trainyard::backend::Engine;
use trainyard::data::loader::Batch;

/// The `train` binary's allocator, so buffers are reused the same way (see src/main.rs).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn experiment(model: &str, size: usize) -> anyhow::Result<trainyard::schema::Experiment> {
    let text = format!(
        "task_name: t\nseed: 3\nmodel: {model}\ndata: {{name: synthetic, num_classes: 10, image_size: {size}, batch_size: 64}}\n\
         optimizer: {{name: sgd, lr: 0.01, momentum: 0.9}}\nscheduler: {{name: constant}}\n\
         trainer: {{strategy: single, accelerator: cpu, devices: 1, precision: 32, max_epochs: 1}}\n\
         paths: {{root_dir: ., data_dir: d, log_dir: l, output_dir: o}}\n"
    );
    let node = trainyard::config::yaml::parse(&text, "profile.yaml")?
        .ok_or_else(|| anyhow::anyhow!("empty"))?;
    Ok(trainyard::schema::extract(&node)?)
}

/// Median milliseconds of `f` over `n` runs (after one warm-up).
fn ms(n: usize, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    f()?;
    let mut t = Vec::with_capacity(n);
    for _ in 0..n {
        let s = Instant::now();
        f()?;
        t.push(s.elapsed().as_secs_f64() * 1e3);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[n / 2])
}

/// The process's minor page faults so far (/proc/self/stat field 10).
fn minor_faults() -> i64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    after
        .split_whitespace()
        .nth(7)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn rand(shape: &[usize]) -> anyhow::Result<Tensor> {
    Ok(Tensor::randn(0f32, 1f32, shape, &Device::Cpu)?)
}

/// Forward time, and backward time of `y.backward()` (seeded with ones) through one op.
fn op(
    name: &str,
    n: usize,
    x: &Var,
    f: impl Fn(&Tensor) -> candle_core::Result<Tensor>,
) -> anyhow::Result<()> {
    let fwd = ms(n, || {
        f(x.as_tensor())?;
        Ok(())
    })?;
    let bwd = ms(n, || {
        let y = f(x.as_tensor())?;
        y.backward()?;
        Ok(())
    })? - fwd;
    println!("  {name:40} fwd {fwd:7.2} ms   bwd {bwd:7.2} ms");
    Ok(())
}

fn main() -> anyhow::Result<()> {
    // SAFETY: set before any worker thread exists; 15 is mimalloc's purge delay (as in src/main.rs).
    unsafe { libmimalloc_sys::mi_option_set(15, -1) };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let which = args.first().map(String::as_str).unwrap_or("cnn");
    let steps: usize = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(20);
    let model = match which {
        "cnn" => "{name: cnn, num_classes: 10, channels: [16, 32, 64]}",
        "resnet50-64px" => "{name: resnet50, num_classes: 10}",
        "vit-tiny" => "{name: vit, variant: tiny, patch_size: 8, image_size: 32, num_classes: 10}",
        _ => "{name: resnet18, num_classes: 10, cifar_stem: true}",
    };
    let size = if which == "resnet50-64px" { 64 } else { 32 };
    if std::env::var("ONLY_POOL_BWD").is_ok() {
        let x = Var::from_tensor(&rand(&[64, 16, 32, 32])?)?;
        for _ in 0..300 {
            fused::max_pool2d(x.as_tensor(), 2, 2, 0)?.backward()?;
        }
        return Ok(());
    }
    // The per-op tables run on a worker of the compute pool, as a train step does (`forward_backward`):
    // called from outside it, every kernel's parallel loop is queued into the pool and the caller sleeps
    // and wakes, ~60 us an op on a VM.
    let per_op: Option<fn(usize) -> anyhow::Result<()>> = match which {
        "resnet-convs" => Some(resnet_convs),
        "resnet-ops" => Some(resnet_ops),
        "vit-ops" => Some(vit_ops),
        _ => None,
    };
    if let Some(table) = per_op {
        return trainyard::backend::candle::kernels::cpu::on_compute_pool(|| table(steps));
    }
    let mut engine = CandleEngine::new(&experiment(model, size)?)?;
    let x = rand(&[64, 3, size, size])?
        .flatten_all()?
        .to_vec1::<f32>()?;
    let batch = Batch {
        images: x,
        labels: (0..64).map(|i| i % 10).collect(),
        channels: 3,
        height: size,
        width: size,
        staged: None,
        tensors: None,
    };
    let (mut fb, mut opt) = (Vec::new(), Vec::new());
    let mut faults = Vec::new();
    for _ in 0..steps + 1 {
        let f0 = minor_faults();
        let s = Instant::now();
        engine.forward_backward(&batch, 1.0)?;
        fb.push(s.elapsed().as_secs_f64() * 1e3);
        let s = Instant::now();
        engine.optimizer_step(0.01, None, None)?;
        opt.push(s.elapsed().as_secs_f64() * 1e3);
        faults.push(minor_faults() - f0);
    }
    if std::env::var("PROFILE_EVAL").is_ok() {
        let t = ms(steps, || {
            engine.evaluate(&batch)?;
            Ok(())
        })?;
        println!("{which}: evaluate (eval-mode forward) {t:.2} ms");
    }
    println!(
        "page faults per step: {:?}",
        &faults[..faults.len().min(10)]
    );
    let first: Vec<String> = fb.iter().take(10).map(|t| format!("{t:.1}")).collect();
    println!("first steps (fwd+bwd ms): {}", first.join(" "));
    let med = |v: &mut Vec<f64>| {
        v.remove(0);
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "{which}: forward+backward {:.2} ms, optimizer {:.2} ms",
        med(&mut fb),
        med(&mut opt)
    );
    if which != "cnn" {
        return Ok(());
    }
    trainyard::backend::candle::kernels::cpu::on_compute_pool(|| cnn_ops(steps))
}

/// The small CNN's kernels one at a time, forward and backward.
fn cnn_ops(steps: usize) -> anyhow::Result<()> {
    let big = rand(&[64, 16, 32, 32])?;
    let t = ms(steps, || {
        fused::max_pool2d(&big, 2, 2, 0)?;
        Ok(())
    })?;
    let t2 = ms(steps, || {
        big.max_pool2d(2)?;
        Ok(())
    })?;
    let t3 = ms(steps, || {
        fused::relu(&big)?;
        Ok(())
    })?;
    let t4 = ms(steps, || {
        big.zeros_like()?.add(&big)?;
        Ok(())
    })?;
    let t5 = ms(steps, || {
        big.ones_like()?;
        Ok(())
    })?;
    println!("16x32x32: zeros_like+add (a backward edge) {t4:.2} ms, ones_like {t5:.2} ms");
    println!("pool 16x32x32 untracked: ours {t:.2} ms, candle {t2:.2} ms, relu {t3:.2} ms");
    let n = steps;
    let mut c_in = 3;
    let mut hw = 32;
    for c in [16usize, 32, 64] {
        let x = Var::from_tensor(&rand(&[64, c_in, hw, hw])?)?;
        let w = Var::from_tensor(&rand(&[c, c_in, 3, 3])?)?;
        let b = Var::from_tensor(&rand(&[c])?)?;
        let wt = w.as_tensor().clone();
        op(&format!("conv {c_in}->{c} {hw}px (dx+dw)"), n, &x, |x| {
            conv::conv2d(x, &wt, 1, 1)
        })?;
        let (wt2, bt2) = (wt.clone(), b.as_tensor().clone());
        op(
            &format!("conv+bias+relu {c_in}->{c} {hw}px (dx+dw)"),
            n,
            &x,
            |x| conv_relu::conv2d_bias_relu(x, &wt2, &bt2, 1, 1),
        )?;
        let xc = Tensor::randn(0f32, 1f32, (64, c_in, hw, hw), &Device::Cpu)?;
        let wv = w.clone();
        op(&format!("conv {c_in}->{c} {hw}px (dw only)"), n, &wv, |w| {
            conv::conv2d(&xc, w, 1, 1)
        })?;
        let y = Var::from_tensor(&rand(&[64, c, hw, hw])?)?;
        let bt = b.as_tensor().clone();
        op(&format!("bias {c}x{hw}x{hw}"), n, &y, |y| {
            fused::add_channel_bias(y, &bt)
        })?;
        op(&format!("relu {c}x{hw}x{hw}"), n, &y, fused::relu)?;
        op(&format!("maxpool {c}x{hw}x{hw}"), n, &y, |y| {
            fused::max_pool2d(y, 2, 2, 0)
        })?;
        if let Some(isa) = direct::active() {
            let xb = Var::from_tensor(&direct::layout::to_blocked(x.as_tensor(), isa.lanes())?)?;
            let wt3 = wt.clone();
            op(
                &format!("blocked direct conv {c_in}->{c} {hw}px (dx+dw)"),
                n,
                &xb,
                |x| direct::conv::conv2d(isa, x, &wt3, 1, 1),
            )?;
            let yb = Var::from_tensor(&direct::layout::to_blocked(y.as_tensor(), isa.lanes())?)?;
            let bt3 = b.as_tensor().clone();
            op(&format!("blocked bias+relu {c}x{hw}x{hw}"), n, &yb, |y| {
                direct::elementwise::bias_relu(y, &bt3)
            })?;
            op(
                &format!("blocked maxpool {c}x{hw}x{hw}"),
                n,
                &yb,
                direct::elementwise::max_pool2,
            )?;
        }
        c_in = c;
        hw /= 2;
    }
    let h = Var::from_tensor(&rand(&[64, 64, 4, 4])?)?;
    op("mean(-1).mean(-1) 64x4x4", n, &h, |h| h.mean(3)?.mean(2))?;
    let logits = Var::from_tensor(&rand(&[64, 10])?)?;
    let labels = Tensor::from_vec((0..64u32).map(|i| i % 10).collect(), 64, &Device::Cpu)?;
    op("cross_entropy 64x10", n, &logits, |z| {
        candle_nn::loss::cross_entropy(z, &labels)
    })?;
    Ok(())
}

/// Every conv shape of ResNet-18 (CIFAR stem, batch 64) with how often it occurs: forward and backward
/// (input and weight gradients) times on the im2col path and, where this CPU has one, the blocked direct
/// path (`bench/conv_profile.py` sets these rows against PyTorch's).
fn resnet_convs(n: usize) -> anyhow::Result<()> {
    // (c_in, c_out, hw_in, k, stride, count)
    let shapes = [
        (3, 64, 32, 3, 1, 1),
        (64, 64, 32, 3, 1, 4),
        (64, 128, 32, 3, 2, 1),
        (64, 128, 32, 1, 2, 1),
        (128, 128, 16, 3, 1, 3),
        (128, 256, 16, 3, 2, 1),
        (128, 256, 16, 1, 2, 1),
        (256, 256, 8, 3, 1, 3),
        (256, 512, 8, 3, 2, 1),
        (256, 512, 8, 1, 2, 1),
        (512, 512, 4, 3, 1, 3),
    ];
    let direct_isa = direct::active();
    println!(
        "direct path: {}",
        direct_isa.map(|i| i.name()).unwrap_or("off (im2col only)")
    );
    let mut totals = [[0.0f64; 2]; 2];
    for (c_in, c_out, hw, k, stride, count) in shapes {
        let pad = k / 2;
        let x = rand(&[64, c_in, hw, hw])?;
        let w = rand(&[c_out, c_in, k, k])?;
        let mut row = format!("  {c_in:3}->{c_out:3} {hw:2}px k{k} s{stride} x{count}:");
        for (path, totals) in totals.iter_mut().enumerate() {
            let conv_fn: Box<ConvFn> = match path {
                0 => Box::new(move |x, w| conv::conv2d(x, w, stride, pad)),
                _ => match direct_isa {
                    Some(isa) => Box::new(move |x, w| direct::conv::conv2d(isa, x, w, stride, pad)),
                    None => continue,
                },
            };
            let input = match (path, direct_isa) {
                (1, Some(isa)) => direct::layout::to_blocked(&x, isa.lanes())?,
                _ => x.clone(),
            };
            let (fwd, bwd) = fwd_bwd(n, &input, &w, &*conv_fn)?;
            row += &format!(
                "  {} fwd {fwd:7.2} ms bwd {bwd:7.2} ms",
                ["im2col", "direct"][path]
            );
            totals[0] += fwd * count as f64;
            totals[1] += bwd * count as f64;
        }
        println!("{row}");
    }
    println!(
        "resnet18 convs: im2col forward {:.1} ms, backward {:.1} ms; direct forward {:.1} ms, backward {:.1} ms",
        totals[0][0], totals[0][1], totals[1][0], totals[1][1]
    );
    Ok(())
}

/// A convolution of `x` with `w` (either path).
type ConvFn = dyn Fn(&Tensor, &Tensor) -> candle_core::Result<Tensor>;

/// Forward time, and backward time (input and weight gradients), of one convolution.
fn fwd_bwd(n: usize, x: &Tensor, w: &Tensor, conv_fn: &ConvFn) -> anyhow::Result<(f64, f64)> {
    let x = Var::from_tensor(x)?;
    let w = Var::from_tensor(w)?;
    let fwd = ms(n, || {
        conv_fn(x.as_tensor(), w.as_tensor())?;
        Ok(())
    })?;
    let both = ms(n, || {
        conv_fn(x.as_tensor(), w.as_tensor())?.backward()?;
        Ok(())
    })?;
    Ok((fwd, both - fwd))
}

/// The elementwise and normalisation ops of ResNet-18 (CIFAR stem, batch 64) at layer1's shape
/// (64x64x32x32), each forward and backward, to set against PyTorch's per-op profile.
fn resnet_ops(n: usize) -> anyhow::Result<()> {
    let x = Var::from_tensor(&rand(&[64, 64, 32, 32])?)?;
    let id = Var::from_tensor(&rand(&[64, 64, 32, 32])?)?;
    let gamma = Var::from_tensor(&rand(&[64])?)?;
    let beta = Var::from_tensor(&rand(&[64])?)?;
    let (g, b) = (gamma.as_tensor().clone(), beta.as_tensor().clone());
    op("batchnorm 64x64x32x32", n, &x, |x| {
        Ok(
            batchnorm::train(x, &g, &b, 1e-5, batchnorm::Then::Nothing, None)?
                .expect("cpu")
                .0,
        )
    })?;
    op("relu 64x64x32x32", n, &x, fused::relu)?;
    let idt = id.as_tensor().clone();
    op("add 64x64x32x32", n, &x, |x| x + &idt)?;
    op("bn+relu 64x64x32x32", n, &x, |x| {
        fused::relu(
            &batchnorm::train(x, &g, &b, 1e-5, batchnorm::Then::Nothing, None)?
                .expect("cpu")
                .0,
        )
    })?;
    if let Some(isa) = direct::active() {
        let xb = Var::from_tensor(&direct::layout::to_blocked(x.as_tensor(), isa.lanes())?)?;
        let idb = direct::layout::to_blocked(id.as_tensor(), isa.lanes())?;
        for then in [batchnorm::Then::Nothing, batchnorm::Then::Relu] {
            op(&format!("blocked bn ({then:?}) 64x64x32x32"), n, &xb, |x| {
                Ok(direct::batchnorm::train(x, &g, &b, 1e-5, (then, false), None)?.0)
            })?;
        }
        op("blocked add+relu 64x64x32x32", n, &xb, |x| {
            fused::add_relu(x, &idb)
        })?;
        op("to_blocked 64x64x32x32", n, &x, |x| {
            direct::layout::to_blocked(x, isa.lanes())
        })?;
        op("from_blocked 64x64x32x32", n, &xb, |x| {
            direct::layout::from_blocked(x, 64)
        })?;
        op("x + x (a gradient sum) 64x64x32x32", n, &xb, |x| x + x)?;
    }
    op("bn+add+relu 64x64x32x32", n, &x, |x| {
        fused::relu(
            &(batchnorm::train(x, &g, &b, 1e-5, batchnorm::Then::Nothing, None)?
                .expect("cpu")
                .0
                + &idt)?,
        )
    })?;
    Ok(())
}

/// ViT-Tiny/8's ops at batch 64 (17 tokens of 192), each forward and backward, on the path `train` takes.
/// The three matrix products of each ViT-Tiny linear layer (batch 64 × 17 tokens as rows) on our GEMM
/// alone: forward `x·wᵀ + b`, input gradient `dy·w`, weight gradient `dyᵀ·x` (A read down its columns).
/// `bench/vit_profile.py` sets them beside MKL's (`torch.addmm`/`torch.mm`) on the same shapes.
fn vit_ops(n: usize) -> anyhow::Result<()> {
    use trainyard::backend::candle::autocast::Autocast;
    let ac = Autocast::OFF;
    let x = Var::from_tensor(&rand(&[64, 17, 192])?)?;
    let hidden = Var::from_tensor(&rand(&[64, 17, 768])?)?;
    for (name, input, i, o) in [
        ("linear qkv 192->576", &x, 192, 576),
        ("linear proj 192->192", &x, 192, 192),
        ("linear fc1 192->768", &x, 192, 768),
        ("linear fc2 768->192", &hidden, 768, 192),
    ] {
        let w = Var::from_tensor(&(rand(&[o, i])? * 0.05)?)?;
        let b = Var::from_tensor(&rand(&[o])?)?;
        let (wt, bt) = (w.as_tensor().clone(), b.as_tensor().clone());
        op(name, n, input, |x| ac.linear(x, &wt, &bt))?;
    }
    let q = Var::from_tensor(&rand(&[64, 3, 17, 64])?)?;
    let k = rand(&[64, 3, 17, 64])?;
    op("q @ k^T (64x3, 17x64x17)", n, &q, |q| ac.matmul(q, &k.t()?))?;
    let attn = Var::from_tensor(&rand(&[64, 3, 17, 17])?)?;
    op("attn @ v (64x3, 17x17x64)", n, &attn, |a| ac.matmul(a, &k))?;
    let isa = direct::active();
    let (g, b) = (rand(&[192])?, rand(&[192])?);
    op("layer norm 64x17x192", n, &x, |x| match isa {
        Some(isa) => Ok(direct::rowwise::layer_norm(isa, x, &g, &b, 1e-6)?.expect("cpu f32")),
        None => candle_nn::ops::layer_norm(x, &g, &b, 1e-6),
    })?;
    op("softmax 64x3x17x17", n, &attn, |x| match isa {
        Some(isa) => Ok(direct::rowwise::softmax_last_dim(isa, x)?.expect("cpu f32")),
        None => candle_nn::ops::softmax_last_dim(x),
    })?;
    op("gelu 64x17x768", n, &hidden, |x| match isa {
        Some(isa) => Ok(direct::rowwise::gelu_erf(isa, x)?.expect("cpu f32")),
        None => x.gelu_erf(),
    })?;
    if let Some(isa) = isa {
        let qkv = Var::from_tensor(&rand(&[64, 17, 576])?)?;
        op("attention (3 heads) 64x17x576", n, &qkv, |t| {
            Ok(direct::attention::self_attention(isa, t, 3, 0.125)?.expect("cpu f32"))
        })?;
    }
    let y = rand(&[64, 17, 192])?;
    op("residual add 64x17x192", n, &x, |x| x + &y)?;
    op("qkv split (permute + contiguous)", n, &hidden, |h| {
        h.narrow(2, 0, 576)?
            .reshape((64, 17, 3, 3, 64))?
            .permute((2, 0, 3, 1, 4))?
            .get(0)?
            .contiguous()
    })?;
    Ok(())
}
