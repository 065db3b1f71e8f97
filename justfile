# Recipes for everyday work. `just --list` shows them. (Install just with `cargo install just`.)

# The build the recipes run: release, or `TRAIN_PROFILE=dev just ...` to reuse a debug build (CI does).
profile := env("TRAIN_PROFILE", "release")

# Run the train binary with Hydra-style overrides: `just train experiment=quickstart trainer.max_epochs=1`
train *ARGS:
    cargo run --profile {{profile}} --quiet -- {{ARGS}}

# Run a named sweep from conf/sweep/NAME.yaml: `just sweep batch_size`
sweep NAME *ARGS:
    cargo run --profile {{profile}} --quiet -- -m sweep={{NAME}} {{ARGS}}

# Write logs/logbook.md (tables, plots, sweep sections) from the runs under logs/: `just logbook`
logbook *ARGS:
    cargo run --profile {{profile}} --quiet -- logbook {{ARGS}}

# The test suite (what CI runs)
test:
    cargo test

# Benchmarks against the tools a user would otherwise use; results go to bench/RESULTS.md
bench:
    bash bench/run.sh
