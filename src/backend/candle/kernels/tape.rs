//! trainyard's own reverse pass over its own ops. Candle's backward adds each gradient contribution into
//! a zero tensor it allocates first (`or_insert` + `add`, candle#1241): for every edge of the graph a
//! buffer the size of the activation is allocated, cleared, read and written once more, ~8% of a
//! ResNet-18 step. The kernels' ops (`op1`/`op2`/`op3`, which every kernel applies its `CustomOp` through)
//! are also recorded here while a tape is active, and `Tape::backward` walks them in reverse, calling each
//! op's own `bwd` and keeping a first gradient contribution as it is (adding only from the second on).
//!
//! The engine records a model's body (every stage before the head) and runs Candle's backward only over
//! the head, from a leaf cut at the body's output. A body that went through any op not recorded here
//! (a Candle op between two of ours) is `usable() == false`, and the engine keeps Candle's graph, which is
//! built as always: the tape only ever replaces a backward it can do whole.

use candle_core::backprop::GradStore;
use candle_core::{CustomOp1, CustomOp2, CustomOp3, Result, Tensor, TensorId};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

pub mod ops;

type Op1 = Arc<Box<dyn CustomOp1 + Send + Sync>>;
type Op2 = Arc<Box<dyn CustomOp2 + Send + Sync>>;
type Op3 = Arc<Box<dyn CustomOp3 + Send + Sync>>;

/// The backward of a Candle op recorded by `layout` ops: a gradient (or none) per argument.
type Backward = Box<dyn Fn(&Tensor) -> Result<Vec<Option<Tensor>>>>;

/// One recorded op: the op, its arguments and its result.
enum Entry {
    One(Op1, Tensor, Tensor),
    Two(Op2, [Tensor; 2], Tensor),
    Three(Op3, [Tensor; 3], Tensor),
    /// A Candle op (a reshape, a broadcast add, ...) with its backward written here (`ops`).
    Candle(&'static str, Vec<Tensor>, Tensor, Backward),
}

impl Entry {
    fn out(&self) -> &Tensor {
        match self {
            Entry::One(_, _, out) | Entry::Two(_, _, out) | Entry::Three(_, _, out) => out,
            Entry::Candle(_, _, out, _) => out,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Entry::One(op, ..) => op.name(),
            Entry::Two(op, ..) => op.name(),
            Entry::Three(op, ..) => op.name(),
            Entry::Candle(name, ..) => name,
        }
    }

    /// The op's own backward: each argument with its gradient, where the op gives one.
    fn backward(&self, grad: &Tensor) -> Result<Vec<(&Tensor, Tensor)>> {
        let pairs = match self {
            Entry::One(op, a, out) => vec![(a, op.bwd(a, out, grad)?)],
            Entry::Two(op, [a, b], out) => {
                let (ga, gb) = op.bwd(a, b, out, grad)?;
                vec![(a, ga), (b, gb)]
            }
            Entry::Three(op, [a, b, c], out) => {
                let (ga, gb, gc) = op.bwd(a, b, c, out, grad)?;
                vec![(a, ga), (b, gb), (c, gc)]
            }
            Entry::Candle(_, args, _, backward) => args.iter().zip(backward(grad)?).collect(),
        };
        Ok(pairs
            .into_iter()
            .filter_map(|(t, g)| g.map(|g| (t, g)))
            .collect())
    }
}

/// The ops recorded while it was active, in the order they ran.
#[derive(Default)]
pub struct Tape {
    entries: Vec<Entry>,
    outputs: HashSet<TensorId>,
    /// The first op whose argument came from outside the tape (a Candle op): its name.
    foreign: Option<&'static str>,
}

thread_local! {
    /// The tape of the pass running on this thread, if one is recording.
    static ACTIVE: RefCell<Option<Tape>> = const { RefCell::new(None) };
}

/// Runs `f` with a tape recording the kernels' ops it applies on this thread; returns `f`'s result and the
/// tape. A tape already recording (an outer pass) is set aside meanwhile and gets none of these ops.
pub fn record<T>(f: impl FnOnce() -> Result<T>) -> Result<(T, Tape)> {
    let outer = ACTIVE.with(|a| a.replace(Some(Tape::default())));
    let result = f();
    let tape = ACTIVE.with(|a| a.replace(outer)).unwrap_or_default();
    Ok((result?, tape))
}

fn push(entry: Entry, args: &[&Tensor]) {
    ACTIVE.with(|a| {
        if let Some(tape) = a.borrow_mut().as_mut() {
            if tape.foreign.is_none() {
                let outside = args
                    .iter()
                    .any(|t| t.track_op() && !t.is_variable() && !tape.outputs.contains(&t.id()));
                if outside {
                    tape.foreign = Some(entry.name());
                }
            }
            tape.outputs.insert(entry.out().id());
            tape.entries.push(entry);
        }
    });
}

/// Records a Candle op already applied (`out` from `args`) with its backward, when a tape is recording.
pub(crate) fn record_candle(
    name: &'static str,
    args: &[&Tensor],
    out: &Tensor,
    backward: impl Fn(&Tensor) -> Result<Vec<Option<Tensor>>> + 'static,
) {
    if recording() {
        let entry = Entry::Candle(
            name,
            args.iter().map(|t| (*t).clone()).collect(),
            out.clone(),
            Box::new(backward),
        );
        push(entry, args);
    }
}

pub(crate) fn recording() -> bool {
    ACTIVE.with(|a| a.borrow().is_some())
}

/// `x.apply_op1(op)`, recorded on the active tape.
pub fn op1<C: CustomOp1 + Send + Sync + 'static>(x: &Tensor, op: C) -> Result<Tensor> {
    if !recording() {
        return x.apply_op1(op);
    }
    let op: Op1 = Arc::new(Box::new(op));
    let out = x.apply_op1_arc(op.clone())?;
    push(Entry::One(op, x.clone(), out.clone()), &[x]);
    Ok(out)
}

/// `a.apply_op2(b, op)`, recorded on the active tape.
pub fn op2<C: CustomOp2 + Send + Sync + 'static>(a: &Tensor, b: &Tensor, op: C) -> Result<Tensor> {
    if !recording() {
        return a.apply_op2(b, op);
    }
    let op: Op2 = Arc::new(Box::new(op));
    let out = a.apply_op2_arc(b, op.clone())?;
    push(Entry::Two(op, [a.clone(), b.clone()], out.clone()), &[a, b]);
    Ok(out)
}

/// `a.apply_op3(b, c, op)`, recorded on the active tape.
pub fn op3<C: CustomOp3 + Send + Sync + 'static>(
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    op: C,
) -> Result<Tensor> {
    if !recording() {
        return a.apply_op3(b, c, op);
    }
    let op: Op3 = Arc::new(Box::new(op));
    let out = a.apply_op3_arc(b, c, op.clone())?;
    push(
        Entry::Three(op, [a.clone(), b.clone(), c.clone()], out.clone()),
        &[a, b, c],
    );
    Ok(out)
}

impl Tape {
    /// Whether the tape alone can carry `out`'s gradient back to every variable it depends on: every op
    /// took its arguments from variables, untracked tensors or earlier recorded ops, and `out` is one.
    pub fn usable(&self, out: &Tensor) -> bool {
        self.foreign.is_none() && !self.entries.is_empty() && self.outputs.contains(&out.id())
    }

    /// Why the tape is not usable, for the log: the first op that took a foreign argument.
    pub fn foreign_op(&self) -> Option<&'static str> {
        self.foreign
    }

    /// The gradients of the variables `out` depends on, given `out`'s gradient `seed` (callers check
    /// `usable` first). Ops run in reverse order; a tensor's first gradient contribution is kept as it
    /// is, later ones added to it.
    pub fn backward(self, out: &Tensor, seed: Tensor) -> Result<GradStore> {
        let mut pending: HashMap<TensorId, Tensor> = HashMap::new();
        pending.insert(out.id(), seed);
        let mut grads = GradStore::default();
        for entry in self.entries.into_iter().rev() {
            let Some(grad) = pending.remove(&entry.out().id()) else {
                continue;
            };
            for (arg, g) in entry.backward(&grad)? {
                // A gradient is a value, never part of a graph (Candle detaches them too).
                let g = g.detach();
                if arg.is_variable() {
                    let sum = match grads.remove(arg) {
                        Some(prev) => (prev + g)?,
                        None => g,
                    };
                    grads.insert(arg, sum);
                } else if arg.track_op() {
                    let sum = match pending.remove(&arg.id()) {
                        Some(prev) => (prev + g)?,
                        None => g,
                    };
                    pending.insert(arg.id(), sum);
                }
            }
        }
        Ok(grads)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::candle::kernels::fused;
    use candle_core::{Device, Var};

    fn values(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    }

    /// relu(x * w) with x used twice (`add_relu(relu(x), x)`): the tape's gradients equal Candle's.
    #[test]
    fn tape_backward_equals_candles() {
        let dev = Device::Cpu;
        let w = Var::from_vec(vec![0.5f32, -1.0, 2.0, -0.25, 1.5, 0.0], (2, 3), &dev).unwrap();
        let body = |w: &Var| -> Result<Tensor> {
            let h = fused::relu(w.as_tensor())?;
            fused::add_relu(&h, w.as_tensor())
        };
        let seed = Tensor::new(&[[1.0f32, -2.0, 3.0], [0.5, 4.0, -1.0]], &dev).unwrap();
        let out = body(&w).unwrap();
        let reference = (out * &seed)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let (out, tape) = record(|| body(&w)).unwrap();
        assert!(tape.usable(&out));
        let grads = tape.backward(&out, seed).unwrap();
        assert_eq!(
            values(grads.get(w.as_tensor()).unwrap()),
            values(reference.get(w.as_tensor()).unwrap())
        );
    }

    /// A Candle op between two recorded ones makes the tape unusable (its gradient would be lost).
    #[test]
    fn a_foreign_op_makes_the_tape_unusable() {
        let dev = Device::Cpu;
        let w = Var::from_vec(vec![1.0f32, -1.0, 2.0, 3.0], (2, 2), &dev).unwrap();
        let (out, tape) = record(|| {
            let h = fused::relu(w.as_tensor())?;
            fused::relu(&(h * 2.0)?)
        })
        .unwrap();
        assert!(!tape.usable(&out));
        assert_eq!(tape.foreign_op(), Some("trainyard-relu"));
        // Nothing is recorded outside `record`.
        let plain = fused::relu(w.as_tensor()).unwrap();
        assert!(plain.track_op());
    }
}
