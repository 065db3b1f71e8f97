//! Override grammar (placeholder until written).
