#!/usr/bin/env bash
# Packages both crates as `cargo publish` would and verifies them by building each from its .crate:
# trainyard-conv alone, then trainyard against trainyard-conv through cargo's temporary registry
# (target/package/tmp-registry). Every file a build needs must be inside the packages.
#
#   scripts/package-crates.sh        (from the repository root; the .crate files land in target/package/)
#
# Cargo takes what comes from a registry as immutable, keyed by name and version, and ours stays 0.1.0
# from commit to commit, so two of cargo's caches hand an earlier run's trainyard-conv to this one:
# - the unpacked source, $CARGO_HOME/registry/src/-<hash>/trainyard-conv-0.1.0, reused whenever its
#   `.cargo-ok` marker is there (a kept cargo home: CI's failed this way);
# - the build of it in target/: the files unpacked from a .crate carry one fixed mtime, so its fingerprint
#   never turns dirty. Its dep-info lists no source file (cargo drops them for registry sources), which is
#   how it is told from the workspace member's builds, whose dep-info lists src/....
# Both go first; crates.io's sources and our workspace builds stay.
set -euo pipefail
cd "$(dirname "$0")/.."

rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/trainyard-conv-*
for fingerprint in target/*/.fingerprint/trainyard-conv-*; do
    dep_info="$fingerprint/dep-lib-trainyard_conv"
    if [ -f "$dep_info" ] && ! grep -q "src/" "$dep_info"; then
        rm -rf "$fingerprint"
    fi
done

# Warnings about files left out (tests' fixtures, benches) are the point of the package's include list.
cargo package --quiet -p trainyard-conv -p trainyard 2>&1 | { grep -v "^warning: ignoring" || true; }
test -f target/package/trainyard-0.1.0.crate
test -f target/package/trainyard-conv-0.1.0.crate
echo "package-crates: trainyard-conv and trainyard packaged and verified" >&2
