#!/usr/bin/env bash
# The Python client's tests against real dmover services on loopback: a venv in a
# temporary directory, the package pip-installed into it from this checkout, then its
# unittest tests. Usage: python/run-tests.sh [DMOVER_BINARY]
# (default: target/release/dmover of this checkout; build it with
# `cargo build --release -p dmover`). Exits non-zero if a test fails or none ran.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${1:-$here/../target/release/dmover}"
if [ ! -x "$bin" ]; then
    echo "python/run-tests.sh: no dmover binary at $bin (cargo build --release -p dmover)" >&2
    exit 1
fi
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"
venv="$(mktemp -d "${TMPDIR:-/tmp}/dmover-py-venv.XXXXXX")"
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv/venv"
# Installed from a copy, so that the build leaves nothing in the checkout.
mkdir "$venv/pkg"
cp -r "$here/pyproject.toml" "$here/README.md" "$here/src" "$venv/pkg/"
"$venv/venv/bin/pip" install --quiet --disable-pip-version-check "$venv/pkg"
# From the venv's directory, so that the tests import the installed package.
cd "$venv"
PYTHONDONTWRITEBYTECODE=1 DMOVER_BIN="$bin" "$venv/venv/bin/python" -m unittest discover -v -s "$here/tests" 2>&1 | tee "$venv/log"
status=${PIPESTATUS[0]}
if ! grep -Eq '^Ran [1-9][0-9]* tests?' "$venv/log"; then
    echo "python/run-tests.sh: no test ran" >&2
    exit 1
fi
exit "$status"
