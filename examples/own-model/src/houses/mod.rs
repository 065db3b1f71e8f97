//! A regression on a CSV table, beyond classification: the table as a dataset (`table`), a network for its
//! rows (`regressor`) and a loss with its own metrics (`log_cosh`). `experiment=houses` puts them together.

mod log_cosh;
mod regressor;
mod table;
