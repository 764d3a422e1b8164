#!/usr/bin/env bash
# The disk tuner against storage whose every I/O waits (docs/tuning.md, "Disk
# threads"): a server on loopback with `--debug-io-latency-ms` (each chunk read or
# written waits that long on its disk thread, as on a parallel file system where each
# I/O waits on a network round trip, or a disk array behind a slow controller) pulls or
# takes pushes of one file, interleaved over server variants: elastic threads (no
# `--io-threads`) against pinned counts.
#
#   DELAY=50 SIZE=3G CHUNK=1M RUNS=3 DIRECTION=pull bash docs/bench/disk-threads.sh \
#       target/release/dmover "auto=" "p8=--io-threads 8" "p32=--io-threads 32"
#
# Variants: NAME=SERVE OPTIONS. Settings (environment): DELAY (ms a chunk, 50), SIZE
# (the file, 3G), CHUNK (1M), RUNS (3), DIRECTION (pull: the server reads; push: it
# writes), WORK (a directory on the disk under test; default /var/tmp).
# Output: variant,run,seconds,gbit_per_s,server_threads on stdout (the server's disk
# threads at the end, from its `dmover_disk_threads` metric); medians on stderr.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: disk-threads.sh DMOVER NAME=SERVE_OPTIONS..." >&2; exit 2; }
BIN=$(realpath "$1")
shift
DELAY=${DELAY:-50}
SIZE=${SIZE:-3G}
CHUNK=${CHUNK:-1M}
RUNS=${RUNS:-3}
DIRECTION=${DIRECTION:-pull}
PORT=7795 METRICS=7796
W=$(mktemp -d "${WORK:-/var/tmp}/dmover-disk-threads.XXXXXX")
. "$(dirname "${BASH_SOURCE[0]}")/variants.sh"
cleanup() {
    [ -f "$W/serve.pid" ] && kill "$(cat "$W/serve.pid")" 2>/dev/null || true
    rm -rf "$W"
}
trap cleanup EXIT
export DMOVER_KNOWN_HOSTS=$W/known_hosts
mkdir -p "$W/srv" "$W/local"
# Random bytes: no chunk of zeros for the source to skip.
head -c "$SIZE" /dev/urandom >"$W/srv/big"
[ "$DIRECTION" = push ] && mv "$W/srv/big" "$W/local/big"
{
echo "variant,run,seconds,gbit_per_s,server_threads"
for run in $(seq 1 "$RUNS"); do
    for v in "$@"; do
        name=${v%%=*}
        read -ra opts <<<"${v#*=}"
        "$BIN" serve --root "$W/srv" --listen "127.0.0.1:$PORT" --metrics "127.0.0.1:$METRICS" \
            --debug-io-latency-ms "$DELAY" "${opts[@]}" >"$W/serve.log" 2>&1 &
        echo $! >"$W/serve.pid"
        for _ in $(seq 50); do
            curl -sf "http://127.0.0.1:$METRICS/metrics" >/dev/null 2>&1 && break
            sleep 0.1
        done
        if [ "$DIRECTION" = push ]; then
            rm -f "$W/srv/big"
            out=$("$BIN" cp --json --chunk "$CHUNK" "$W/local/big" "dmover://127.0.0.1:$PORT/")
        else
            rm -f "$W/local/big"
            out=$("$BIN" cp --json --chunk "$CHUNK" "dmover://127.0.0.1:$PORT/big" "$W/local/")
        fi
        threads=$(curl -sf "http://127.0.0.1:$METRICS/metrics" | awk '$1 == "dmover_disk_threads" {print $2}')
        kill "$(cat "$W/serve.pid")"
        wait "$(cat "$W/serve.pid")" 2>/dev/null || true
        rm -f "$W/serve.pid"
        python3 - "$out" "$name" "$run" "$threads" <<'PY'
import json, sys
j = json.loads(sys.argv[1])
print(f"{sys.argv[2]},{sys.argv[3]},{j['seconds']:.3f},{j['gbit_per_s']:.3f},{sys.argv[4]}")
PY
    done
done
} | tee "$W/rows.csv"
medians "$W/rows.csv"
