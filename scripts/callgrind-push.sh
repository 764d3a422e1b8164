#!/usr/bin/env bash
# Instructions the client executes (valgrind's callgrind; repeatable on a noisy
# machine): BIN pushes a dataset to its own `dmover serve` on loopback (DIRECTION=pull:
# pulls it from there), on tmpfs at both ends, the client under callgrind. (The server cannot run under valgrind:
# openat2 is not emulated.) Datasets: `large`, one 256 MiB random file; `small`, 2000
# files of 8 KiB. Run two binaries on the same data to compare (the engine issue's
# before/after: instructions per GiB and per 1000 small files within +2 %).
#
#   [DIRECTION=pull] scripts/callgrind-push.sh BIN large|small TAG
#       -> prints "TAG DATASET DIRECTION summary: Ir"
set -euo pipefail
BIN=$1 DATA=$2 TAG=$3 DIRECTION=${DIRECTION:-push}
OUT=${OUT:-/tmp/dmover-callgrind}
W=/dev/shm/dmover-callgrind-push
mkdir -p "$W/src" "$W/state" "$W/dst" "$OUT"
case $DATA in
large)
    [[ -f $W/src/large/f ]] || { mkdir -p "$W/src/large" && head -c $((256 << 20)) /dev/urandom >"$W/src/large/f"; }
    ARGS=(-P 2 --chunk 4M) ;;
small)
    if [[ ! -d $W/src/small ]]; then
        mkdir -p "$W/src/small.tmp"
        for i in $(seq 0 1999); do
            d=$W/src/small.tmp/d$((i / 100))
            mkdir -p "$d"
            head -c 8192 /dev/urandom >"$d/f$i"
        done
        mv "$W/src/small.tmp" "$W/src/small"
    fi
    ARGS=(-P 2) ;;
*) echo "usage: $0 BIN large|small TAG" >&2; exit 2 ;;
esac
rm -rf "${W:?}/dst/$TAG-$DATA"
ROOT=$W/dst
[[ $DIRECTION == pull ]] && ROOT=$W/src
setsid "$BIN" serve --root "$ROOT" --listen 127.0.0.1:0 --state-dir "$W/state" >"$W/serve.out" 2>"$W/serve.log" &
SP=$!
trap 'kill -- -$SP 2>/dev/null || true' EXIT
for _ in $(seq 100); do grep -q "listening on" "$W/serve.out" 2>/dev/null && break; sleep 0.1; done
ADDR=$(sed -n 's/^dmover: listening on //p' "$W/serve.out")
FROM=$W/src/$DATA TO=dmover://$ADDR/$TAG-$DATA
[[ $DIRECTION == pull ]] && FROM=dmover://$ADDR/$DATA TO=$W/dst/$TAG-$DATA
CG=$OUT/cg-$DIRECTION-$TAG-$DATA
DMOVER_KNOWN_HOSTS=$W/kh-$TAG valgrind --tool=callgrind --callgrind-out-file="$CG.out" \
    "$BIN" cp --quiet "${ARGS[@]}" "$FROM" "$TO" 2>"$CG.log"
diff -r "$W/src/$DATA" "$W/dst/$TAG-$DATA"
rm -rf "${W:?}/dst/$TAG-$DATA" "$W/kh-$TAG"
echo "$TAG $DATA $DIRECTION $(grep -E '^(summary|totals):' "$CG.out" | head -1)"
