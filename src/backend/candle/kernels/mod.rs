//! The hand-written CPU kernels the Candle engine calls where Candle's own ops cost extra passes: direct
//! convolution and matrix products on blocked layouts (`direct/`), im2col convolution (`conv`), conv + bias +
//! ReLU (`conv_relu`), BatchNorm (`batchnorm`), small fused ops (`fused`), and what they share (`cpu`).
//! Each has its own backward; off the CPU or for other dtypes the engine uses Candle's ops.

pub mod batchnorm;
pub mod conv;
pub mod conv_relu;
pub mod cpu;
pub mod direct;
pub mod fused;
pub mod tape;
