#!/usr/bin/env bash
# iperf3 and dmover over emulated long-haul links (dmover netlab), side by side.
#
# For every link rate x RTT x congestion control: bring up a lab, then REPS times each
# of iperf3 -P1, iperf3 -P8, dmover cp -P1, dmover cp -P8 (dmover: `dmover serve` in
# host b, `dmover cp` push from host a, default settings otherwise, data on tmpfs at
# both ends so the disks are not the limit). One CSV row per run, with the
# forwarder's CPU and release lateness so an emulator limit shows.
#
# Usage (root; iperf3 and python3 installed):
#   scripts/bench-netlab.sh [--rates "1gbit 5gbit"] [--rtts "0 50 100 200"]
#       [--ccs "bbr cubic"] [--reps 3] [--seconds 10] [--tools "iperf3 dmover"]
#       [--streams "1 8"] [--out docs/bench/netlab.csv] [--lock /work/bench.lock]
#       [--dmover-args "..."]  (extra dmover cp options, for A/B runs; recorded)
#       [--netlab-args "..."]  (extra dmover netlab up options, e.g. --no-pin; recorded)
#       [--links N]  (dmover moves N hard links of the 1.25 GB file instead of enough
#                     for --seconds at the link rate; 0: one 1-byte file, which times
#                     the session's fixed round trips)
# Columns besides the end-to-end rate: steady_gbit_per_s, the rate between the moments
# 25 % and 90 % of the bytes had crossed (dmover: `cp --json`'s steady_gbit_per_s;
# iperf3: the same, from its 0.25 s intervals), i.e. without set-up, slow start and the
# tail; first_data_seconds, when the byte counter first moved (dmover: its first whole
# chunk, up to 16 MiB, counted from the client's start, session set-up included;
# iperf3: the first 0.25 s interval with data, counted from its test start, after set-up).
# With --lock FILE each rate x cc group (its RTTs, all their runs, ~10 min) holds
# `flock FILE`, so measurements on a shared machine do not overlap.
set -euo pipefail
cd "$(dirname "$0")/.."

RATES="1gbit 5gbit"
RTTS="0 50 100 200"
CCS="bbr cubic"
REPS=3
SECONDS_PER_RUN=10
TOOLS="iperf3 dmover"
STREAMS="1 8"
OUT=""
LOCK=""
DMOVER_ARGS=""
NETLAB_ARGS=""
LINKS=""
while [ $# -gt 0 ]; do
    case "$1" in
        --rates) RATES="$2"; shift 2 ;;
        --rtts) RTTS="$2"; shift 2 ;;
        --ccs) CCS="$2"; shift 2 ;;
        --reps) REPS="$2"; shift 2 ;;
        --seconds) SECONDS_PER_RUN="$2"; shift 2 ;;
        --tools) TOOLS="$2"; shift 2 ;;
        --streams) STREAMS="$2"; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        --lock) LOCK="$2"; shift 2 ;;
        --dmover-args) DMOVER_ARGS="$2"; shift 2 ;;
        --netlab-args) NETLAB_ARGS="$2"; shift 2 ;;
        --links) LINKS="$2"; shift 2 ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "bench-netlab: needs root" >&2; exit 1; }
for t in iperf3 python3 ip; do
    command -v "$t" >/dev/null || { echo "bench-netlab: $t is not installed" >&2; exit 1; }
done

DMOVER=${DMOVER:-$PWD/target/release/dmover}
[ -x "$DMOVER" ] || nice -n 10 cargo build --release -p dmover
OUT=${OUT:-docs/bench/netlab-$(date +%Y%m%d-%H%M).csv}
mkdir -p "$(dirname "$OUT")"
LAB=bn$$
WORK=/dev/shm/dmover-bench-netlab-$$
PORT=7700

cleanup() {
    "$DMOVER" netlab down --name "$LAB" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# Data on tmpfs: one 1.25 GB incompressible file, hard-linked N times so a push moves
# N x 1.25 GB (>= 10 s at the link rate) while tmpfs holds it once at the source.
mkdir -p "$WORK/src" "$WORK/dst"
head -c $((1250 * 1000 * 1000)) /dev/urandom >"$WORK/file"
printf 'netlab-bench-%s' "$$" >"$WORK/token"

HEADER="when,host,tool,streams,rate,rtt_ms,cc,rep,bytes,seconds,gbit_per_s,link_fraction,retransmits,fwd_cpu_cores,fwd_late_mean_us,fwd_late_p99_us,fwd_queue_drops,dmover_args,netlab_args,steady_gbit_per_s,first_data_seconds"
if [ ! -s "$OUT" ]; then
    echo "$HEADER" >"$OUT"
elif [ "$(head -n1 "$OUT")" != "$HEADER" ]; then
    echo "bench-netlab: $OUT has other columns (an older version of this script); use a new --out" >&2
    exit 1
fi
HOST="$(nproc)cores-$(uname -r)"

# Forwarder statistics of the lab, as "cpu_seconds elapsed late_mean p99 queue_drops".
fwd_stats() {
    "$DMOVER" netlab stats --name "$LAB" --json | python3 -c '
import json, sys
s = json.load(sys.stdin)
a, b = s["a_to_b"], s["b_to_a"]
print(a["cpu_seconds"] + b["cpu_seconds"], s["elapsed_seconds"], a["late_mean_us"], a["late_p99_us"], a["queue_drops"])'
}

rate_bps() { python3 -c "
import re,sys
m=re.fullmatch(r'([0-9.]+)(k|m|g)bit','$1'); print(int(float(m[1])*{'k':1e3,'m':1e6,'g':1e9}[m[2]]))"; }

one_point() { # rate rtt cc
    local rate=$1 rtt=$2 cc=$3
    local bps links
    bps=$(rate_bps "$rate")
    # Enough hard links for SECONDS_PER_RUN at the link rate.
    links=${LINKS:-$(python3 -c "import math; print(max(1, math.ceil($bps*$SECONDS_PER_RUN/8/1.25e9)))")}
    rm -f "$WORK"/src/*
    if [ "$links" = 0 ]; then
        printf x >"$WORK/src/tiny"
    fi
    for i in $(seq 1 "$links"); do ln "$WORK/file" "$WORK/src/part$i"; done

    "$DMOVER" netlab down --name "$LAB" >/dev/null 2>&1 || true
    # shellcheck disable=SC2086
    "$DMOVER" netlab up --name "$LAB" --rtt "${rtt}ms" --rate "$rate" --congestion "$cc" $NETLAB_ARGS >/dev/null
    local ex_a=("$DMOVER" netlab exec --name "$LAB" a --)
    local ex_b=("$DMOVER" netlab exec --name "$LAB" b --)
    local addr_b=10.200.0.2
    "${ex_b[@]}" iperf3 -s -p 5201 >/dev/null 2>&1 &
    "${ex_b[@]}" "$DMOVER" serve --listen "$addr_b:$PORT" --root "$WORK/dst" \
        --state-dir "$WORK/state" --token-file "$WORK/token" >/dev/null 2>&1 &
    sleep 1
    for rep in $(seq 1 "$REPS"); do
        for tool in $TOOLS; do
            for p in $STREAMS; do
                local before after bytes secs gbps retr="" steady first
                before=$(fwd_stats)
                if [ "$tool" = iperf3 ]; then
                    local j
                    j=$("${ex_a[@]}" iperf3 -c "$addr_b" -p 5201 -t "$SECONDS_PER_RUN" -P "$p" -i 0.25 -J)
                    read -r bytes secs gbps retr steady first < <(python3 -c '
import json, sys
j = json.loads(sys.stdin.read())
e = j["end"]
r = e["sum_received"]
# Steady rate, defined as dmover cp --json defines it: the rate between the moments
# 25 % and 90 % of the bytes had been sent (interpolated in the 0.25 s intervals of iperf3);
# "-" when those moments are under 0.5 s apart.
pts, t, b = [(0.0, 0)], 0.0, 0
for iv in j["intervals"]:
    s = iv["sum"]
    t, b = s["end"], b + s["bytes"]
    pts.append((t, b))
def when(x):
    for (t0, b0), (t1, b1) in zip(pts, pts[1:]):
        if b1 >= x:
            return t0 + (t1 - t0) * (x - b0) / max(1, b1 - b0)
total = pts[-1][1]
a, z = when(0.25 * total), when(0.9 * total)
steady = f"{0.65 * total * 8 / (z - a) / 1e9:.3f}" if a is not None and z is not None and z - a >= 0.5 else "-"
first = next((f"{t0:.3f}" for t0, b0 in pts[1:] if b0 > 0), "-")
print(r["bytes"], r["seconds"], r["bits_per_second"] / 1e9, e["sum_sent"].get("retransmits", "") or "-", steady, first)' <<<"$j")
                    [ "$retr" = - ] && retr=""
                else
                    rm -rf "$WORK/dst/run"
                    local j
                    # shellcheck disable=SC2086
                    j=$(DMOVER_KNOWN_HOSTS="$WORK/known_hosts" "${ex_a[@]}" "$DMOVER" cp --json -P "$p" $DMOVER_ARGS \
                        --token-file "$WORK/token" "$WORK/src" "dmover://$addr_b:$PORT/run")
                    read -r bytes secs gbps steady first < <(python3 -c '
import json, sys
j = json.loads(sys.stdin.read())
f = lambda v, fmt: "-" if v is None else fmt.format(v)
print(j["bytes"], j["seconds"], j["gbit_per_s"], f(j.get("steady_gbit_per_s"), "{:.3f}"),
      f(j.get("first_chunk_seconds"), "{:.3f}"))' <<<"$j")
                    rm -rf "$WORK/dst/run"
                fi
                # The statistics file is rewritten every second; CPU and elapsed come
                # from the same snapshot, so the delta is consistent.
                after=$(fwd_stats)
                local fwd
                fwd=$(python3 -c "
b='$before'.split(); a='$after'.split()
cpu=(float(a[0])-float(b[0]))/max(1e-9, float(a[1])-float(b[1]))
print(f'{cpu:.3f},{float(a[2]):.1f},{float(a[3]):.0f},{int(a[4])-int(b[4])}')")
                local frac
                frac=$(python3 -c "print(f'{$gbps*1e9/$bps:.3f}')")
                echo "$(date -Is),$HOST,$tool,$p,$rate,$rtt,$cc,$rep,$bytes,$secs,$(printf %.3f "$gbps"),$frac,$retr,$fwd,\"$DMOVER_ARGS\",\"$NETLAB_ARGS\",${steady/-/},${first/-/}" | tee -a "$OUT"
            done
        done
    done
    "$DMOVER" netlab down --name "$LAB" >/dev/null
    wait 2>/dev/null || true
}

one_group() { # rate cc
    for rtt in $RTTS; do one_point "$1" "$rtt" "$2"; done
}

for rate in $RATES; do
    for cc in $CCS; do
        if [ -n "$LOCK" ]; then
            export -f one_group one_point fwd_stats rate_bps
            export DMOVER LAB WORK PORT REPS SECONDS_PER_RUN TOOLS STREAMS OUT HOST DMOVER_ARGS NETLAB_ARGS RTTS LINKS
            flock "$LOCK" bash -c "one_group $rate $cc"
        else
            one_group "$rate" "$cc"
        fi
    done
done
echo "bench-netlab: rows in $OUT" >&2
