#!/usr/bin/env bash
# A/B of the receiving side on loopback, CPU-bound: two dmover builds push the same
# cached dataset to their own `dmover serve` writing to tmpfs, interleaved round by round,
# in each data protection mode. Reports wall time and the receiving server's CPU time
# (utime + stime from /proc, over the copy) per run.
#
#   scripts/bench-recv-ab.sh BIN_A BIN_B      (run it under `flock /work/bench.lock`)
#
# Environment: RUNS (5), SCALE (0.25: medium 16 x 64 MiB), MODES ("auth encrypt plain"),
# STREAMS (4), OUT (CSV, default /tmp/bench-recv-ab.csv).
set -euo pipefail
A=$1 B=$2
RUNS=${RUNS:-5}
SCALE=${SCALE:-0.25}
MODES=${MODES:-auth encrypt plain}
STREAMS=${STREAMS:-4}
OUT=${OUT:-/tmp/bench-recv-ab.csv}
W=/dev/shm/dmover-recv-ab-$$
mkdir -p "$W/src"
trap 'for f in "$W"/*.pid; do [[ -f $f ]] && kill "$(cat "$f")" 2>/dev/null; done; rm -rf "$W"' EXIT
"$A" bench mkdata "$W/src/medium" --profile medium --scale "$SCALE" >&2
BYTES=$(du -sb --apparent-size "$W/src/medium" | cut -f1)
start() { # name bin -> address
    mkdir -p "$W/dst-$1" "$W/state-$1"
    "$2" serve --root "$W/dst-$1" --listen 127.0.0.1:0 --state-dir "$W/state-$1" \
        >"$W/$1.out" 2>"$W/$1.log" &
    echo $! >"$W/$1.pid"
    for _ in $(seq 100); do grep -q "listening on" "$W/$1.out" 2>/dev/null && break; sleep 0.1; done
}
cpu() { awk '{ print $14 + $15 }' "/proc/$1/stat"; } # clock ticks
start a "$A"
start b "$B"
HZ=$(getconf CLK_TCK)
echo "# $(date -u +%FT%TZ) $(nproc) cores; a=$A b=$B; $BYTES bytes; dst tmpfs, source cached" >"$OUT"
echo "bin,mode,run,seconds,gbit_per_s,server_cpu_s" >>"$OUT"
for run in $(seq "$RUNS"); do
    for mode in $MODES; do
        for x in a b; do
            bin=$A; [[ $x == b ]] && bin=$B
            addr=$(sed -n 's/^dmover: listening on //p' "$W/$x.out")
            pid=$(cat "$W/$x.pid")
            rm -rf "${W:?}/dst-$x/medium"
            case $mode in plain) f=--plain-data ;; auth) f= ;; encrypt) f=--encrypt ;; esac
            c0=$(cpu "$pid"); t0=$(date +%s.%N)
            # shellcheck disable=SC2086
            DMOVER_KNOWN_HOSTS=$W/kh-$x "$bin" cp --quiet -P "$STREAMS" $f "$W/src/medium" "dmover://$addr/medium"
            t1=$(date +%s.%N); c1=$(cpu "$pid")
            diff -rq "$W/src/medium" "$W/dst-$x/medium" >/dev/null
            awk -v x=$x -v m=$mode -v r=$run -v t0=$t0 -v t1=$t1 -v c0=$c0 -v c1=$c1 -v b=$BYTES -v hz=$HZ \
                'BEGIN { s = t1 - t0; printf "%s,%s,%d,%.3f,%.3f,%.2f\n", x, m, r, s, b * 8 / s / 1e9, (c1 - c0) / hz }' \
                | tee -a "$OUT" >&2
        done
    done
done
rm -rf "${W:?}"/dst-*
python3 - "$OUT" <<'PY'
import csv, statistics, sys
from collections import defaultdict
rows = list(csv.DictReader(l for l in open(sys.argv[1]) if not l.startswith("#")))
g, c = defaultdict(list), defaultdict(list)
for r in rows:
    g[(r["mode"], r["bin"])].append(float(r["gbit_per_s"])); c[(r["mode"], r["bin"])].append(float(r["server_cpu_s"]))
print("| mode | a Gbit/s | b Gbit/s | b / a | a server CPU s | b server CPU s | b / a |")
print("|---|---|---|---|---|---|---|")
for m in dict.fromkeys(r["mode"] for r in rows):
    ga, gb = statistics.median(g[(m, "a")]), statistics.median(g[(m, "b")])
    ca, cb = statistics.median(c[(m, "a")]), statistics.median(c[(m, "b")])
    print(f"| {m} | {ga:.2f} | {gb:.2f} | {gb/ga:.2f} | {ca:.2f} | {cb:.2f} | {cb/ca:.2f} |")
PY
