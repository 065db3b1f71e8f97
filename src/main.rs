//! `train`: compose an experiment from YAML and overrides, then run it. All logic lives in the library;
//! a user's crate that registers its own models gets the same program from the same macro.

trainyard::main!();
