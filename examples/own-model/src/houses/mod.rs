//! A regression on a CSV table, beyond classification: the table as a dataset (`table`), a network for its
//! rows (`regressor`) and a loss with its own metrics (`log_cosh`). `experiment=houses` puts them together;
//! `experiment=houses_shards` reads the same table as CSV part files streamed shard by shard (`shards`).

mod log_cosh;
mod regressor;
mod shards;
mod table;
