#!/usr/bin/env bash
# Instructions the receiving side executes (valgrind's callgrind; repeatable on a noisy
# machine): BIN pulls a 128 MiB random file from its own `dmover serve` on loopback, on
# tmpfs at both ends, the client (the receiver) under callgrind. (The server cannot run
# under valgrind: openat2 is not emulated.)
#
#   scripts/callgrind-recv.sh BIN plain|auth|encrypt TAG    -> prints "TAG MODE summary: Ir"
set -euo pipefail
BIN=$1 MODE=$2 TAG=$3
OUT=${OUT:-/tmp/dmover-callgrind}
W=/dev/shm/dmover-callgrind
mkdir -p "$W/src" "$W/state" "$OUT"
[[ -f $W/src/f ]] || head -c $((128 << 20)) /dev/urandom >"$W/src/f"
rm -rf "$W/dst-$TAG-$MODE"
setsid "$BIN" serve --root "$W/src" --listen 127.0.0.1:0 --state-dir "$W/state" >"$W/serve.out" 2>"$W/serve.log" &
SP=$!
trap 'kill -- -$SP 2>/dev/null || true' EXIT
for _ in $(seq 100); do grep -q "listening on" "$W/serve.out" 2>/dev/null && break; sleep 0.1; done
ADDR=$(sed -n 's/^dmover: listening on //p' "$W/serve.out")
case $MODE in plain) F=--plain-data ;; auth) F= ;; encrypt) F=--encrypt ;; esac
# shellcheck disable=SC2086
DMOVER_KNOWN_HOSTS=$W/kh-$TAG-$MODE valgrind --tool=callgrind --callgrind-out-file="$OUT/cg-$TAG-$MODE.out" \
    "$BIN" cp --quiet -P 2 --chunk 4M $F "dmover://$ADDR/f" "$W/dst-$TAG-$MODE" 2>"$OUT/cp-$TAG-$MODE.log"
cmp "$W/src/f" "$W/dst-$TAG-$MODE"
rm -rf "${W:?}/dst-$TAG-$MODE" "$W/kh-$TAG-$MODE"
echo "$TAG $MODE $(grep -E '^(summary|totals):' "$OUT/cg-$TAG-$MODE.out" | head -1)"
