//! How replicas, gradients, parameters and optimizer state are placed and kept in step. The trainer loop
//! is the same for every strategy; it asks the strategy to start a run (`ddp::start`), to make gradients
//! global before each optimizer step, and to make statistics global before they are logged.

pub mod ddp;
