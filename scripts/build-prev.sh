#!/usr/bin/env bash
# Builds the dmover binary of an older commit, for the upgrade tests
# (crates/dmover/tests/upgrade.rs, docs/protocol.md "Upgrades"):
#
#   scripts/build-prev.sh e8ed9b2            # prints the binary's path
#   DMOVER_PREV_BIN=$(scripts/build-prev.sh e8ed9b2) \
#       cargo test --release -p dmover --test upgrade -- --ignored
#
# The commit is checked out in a temporary git worktree and built into this checkout's
# target directory, so dependencies both share are not built again. Cargo names a
# workspace crate's build by its path inside the workspace, so the older build replaces
# this checkout's crates in target/: the script copies the binary out (to
# target/prev/dmover-COMMIT) and builds this checkout again, its build script rerun so
# that `dmover --version` names this checkout's commit again.
set -euo pipefail
rev=${1:?usage: scripts/build-prev.sh COMMIT}
top=$(git rev-parse --show-toplevel)
commit=$(git -C "$top" rev-parse --short "$rev^{commit}")
out="$top/target/prev/dmover-$commit"
if [[ -x $out ]]; then
    echo "$out"
    exit 0
fi
wt=$(mktemp -d -t dmover-prev-XXXXXX)
trap 'git -C "$top" worktree remove --force "$wt" >/dev/null 2>&1 || rm -rf "$wt"' EXIT
git -C "$top" worktree add --detach --quiet "$wt" "$commit"
target=${CARGO_TARGET_DIR:-$top/target}
(cd "$wt" && CARGO_TARGET_DIR=$target cargo build --release --locked -p dmover >&2)
mkdir -p "$(dirname "$out")"
cp "$target/release/dmover" "$out"
touch "$top/crates/dmover/build.rs"
(cd "$top" && cargo build --release --locked -p dmover >&2)
echo "$out"
