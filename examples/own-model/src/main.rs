//! A project's own model, data and loss, trained by trainyard: each file registers what it defines under
//! the `_target_` its config names, and `main` is trainyard's whole `train` command line (composition and
//! overrides, sweeps, launchers, every strategy, checkpoints, loggers, the logbook).
//!
//! - `se_net`: an image classifier with a squeeze-and-excitation gate (`model=se_net`, the default), on
//!   Candle; `se_net_tch`: the same network on libtorch (`--features torch`, `backend=tch`).
//! - `houses`: a regression on a CSV table: its dataset, a network for table rows, and a loss with its own
//!   metrics (`experiment=houses`).
//! - `shapes`: segmentation: generated images with their masks and a U-Net that labels every pixel,
//!   measured by mean IoU and Dice (`experiment=shapes`).
//! - `lion`, `warmup_cosine`: an optimizer and a learning-rate schedule of its own (`optimizer=lion`,
//!   `scheduler=warmup_cosine`), on every backend and strategy.

mod houses;
mod lion;
mod se_net;
#[cfg(feature = "torch")]
mod se_net_tch;
mod shapes;
mod warmup_cosine;

trainyard::main!();
