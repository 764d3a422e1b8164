#!/usr/bin/env bash
# Counts stalled transfers over many runs (issue 13): `dmover cp -P STREAMS` pushes over
# a `dmover netlab` link (default 5 Gbit/s, 200 ms, BBR: where one data stream went
# silent in 2 of 15 runs on 2026-11-23), RUNS times, while a probe records every second
# what the kernel says about the data connections (`ss -tin` in the sending namespace:
# unsent bytes, cwnd, retransmissions) and about TCP memory (`/proc/net/sockstat` pages
# against `net.ipv4.tcp_mem`'s pressure threshold). One CSV line per run on stdout; a run
# is a stall when a stream was lost or it took over twice the median time.
#
#   DMOVER=target/release/dmover RUNS=15 bash docs/bench/stall-count.sh > stalls.csv
#
# Settings (environment): RUNS (15), STREAMS (8), RATE (5gbit), RTT (200), CC (bbr),
# GB (6.25: bytes pushed per run, in 1.25 GB files on tmpfs), KEEP=DIR (keep each
# run's probe log there), EXTRA (more `dmover cp` options), NETLAB_ARGS (more `dmover
# netlab up` options, e.g. `--tcp-buffer-max 64M`). Needs root and python3.
set -euo pipefail
DMOVER=$(realpath "${DMOVER:-$(command -v dmover)}")
RUNS=${RUNS:-15}
STREAMS=${STREAMS:-8}
RATE=${RATE:-5gbit}
RTT=${RTT:-200}
CC=${CC:-bbr}
GB=${GB:-6.25}
EXTRA=${EXTRA:-}
NETLAB_ARGS=${NETLAB_ARGS:-}
LAB=st$$
WORK=$(mktemp -d /dev/shm/dmover-stall.XXXXXX)
FAR=10.200.0.2 PORT=7790

cleanup() {
    [ -f "$WORK/serve.pid" ] && kill "$(cat "$WORK/serve.pid")" 2>/dev/null || true
    "$DMOVER" netlab down --name "$LAB" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

mkdir -p "$WORK/src" "$WORK/dst"
head -c $((1250 * 1000 * 1000)) /dev/urandom >"$WORK/file"
links=$(python3 -c "import math; print(max(1, math.ceil($GB / 1.25)))")
# Copies, not hard links: dmover sends a hard-linked file's data once.
for i in $(seq 1 "$links"); do cp "$WORK/file" "$WORK/src/part$i"; done
rm "$WORK/file"
printf 'stall-count-%s' "$$" >"$WORK/token"
read -r _ PRESSURE _ </proc/sys/net/ipv4/tcp_mem

# shellcheck disable=SC2086
"$DMOVER" netlab up --name "$LAB" --rtt "${RTT}ms" --rate "$RATE" --congestion "$CC" \
    $NETLAB_ARGS >/dev/null
A=dmnl-$LAB-a B=dmnl-$LAB-b
ip netns exec "$B" "$DMOVER" serve --listen "$FAR:$PORT" --root "$WORK/dst" \
    --state-dir "$WORK/state" --token-file "$WORK/token" >"$WORK/serve.log" 2>&1 &
echo $! >"$WORK/serve.pid"
sleep 1

# probe LOG: every second until killed, one line per data connection to the server
# ("t=SECONDS notsent=B cwnd=N retrans=N bytes_acked=B") and one "mem=PAGES" line.
probe() {
    local t0=$SECONDS
    while true; do
        local now=$((SECONDS - t0))
        ip netns exec "$A" ss -tinH state established "( dport = :$PORT )" 2>/dev/null |
            python3 -c '
import re, sys
t = sys.argv[1]
for line in sys.stdin.read().split("\n"):
    if "cwnd:" not in line:
        continue
    g = lambda k: (re.search(r"\b" + k + r"[:=]([0-9]+)", line) or [None, "0"])[1]
    r = re.search(r"\bretrans:[0-9]+/([0-9]+)", line)
    print("t={} notsent={} cwnd={} retrans={} bytes_acked={}".format(
        t, g("notsent"), g("cwnd"), r[1] if r else 0, g("bytes_acked")))
' "$now" >>"$1" || true
        echo "t=$now mem=$(awk '/^TCP:/ {for (i = 1; i < NF; i++) if ($i == "mem") print $(i + 1)}' /proc/net/sockstat)" >>"$1"
        sleep 1
    done
}

RUNS_CSV=$WORK/runs.csv
: >"$RUNS_CSV"
for run in $(seq 1 "$RUNS"); do
    log=$WORK/probe-$run.log
    : >"$log"
    probe "$log" &
    ppid=$!
    rm -rf "$WORK/dst/run"
    # shellcheck disable=SC2086
    j=$(DMOVER_KNOWN_HOSTS="$WORK/known_hosts" ip netns exec "$A" "$DMOVER" cp --json \
        -P "$STREAMS" $EXTRA --token-file "$WORK/token" "$WORK/src" "dmover://$FAR:$PORT/run" \
        2>>"$WORK/cp.log" || true)
    kill "$ppid" 2>/dev/null || true
    wait "$ppid" 2>/dev/null || true
    rm -rf "$WORK/dst/run"
    if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$log" "$KEEP/"; fi
    CP_JSON=$j python3 - "$log" "$PRESSURE" "$run,$STREAMS,$RATE,$RTT,$CC" >>"$RUNS_CSV" <<'EOF'
import json, os, sys
try:
    j = json.loads(os.environ["CP_JSON"])
except ValueError:
    j = {}
log, pressure, head = sys.argv[1], int(sys.argv[2]), sys.argv[3]
mem, notsent, cwnd, acked = [], [], [], {}
for l in open(log):
    d = dict(kv.split("=", 1) for kv in l.split())
    if "mem" in d:
        mem.append(int(d["mem"] or 0))
        continue
    notsent.append(int(d["notsent"]))
    if int(d["notsent"]) > 0:
        cwnd.append(int(d["cwnd"]))
    acked.setdefault(int(d["t"]), []).append(int(d["bytes_acked"]))
# The longest spell (s) in which the connections' acknowledged bytes, summed, did not
# grow: how long the data stood still.
flat, best, last = 0, 0, None
for t in sorted(acked):
    s = sum(acked[t])
    flat = flat + 1 if last is not None and s == last else 0
    best, last = max(best, flat), s
secs = j.get("seconds")
print(",".join(str(x) for x in [head, "failed" if secs is None else secs,
    j.get("gbit_per_s", ""), j.get("streams_lost", ""), j.get("chunks_resent", ""),
    max(mem, default=0), pressure, f"{max(notsent, default=0) / 2**20:.1f}",
    min(cwnd, default=0), best]))
EOF
    echo "stall-count: run $run of $RUNS done" >&2
done
python3 - "$RUNS_CSV" <<'EOF'
import statistics, sys
rows = [l.rstrip("\n").split(",") for l in open(sys.argv[1]) if l.strip()]
secs = [float(r[5]) for r in rows if r[5] != "failed"]
med = statistics.median(secs) if secs else 0.0
print("run,streams,rate,rtt_ms,cc,seconds,gbit_per_s,streams_lost,chunks_resent,"
      "max_tcp_mem_pages,tcp_mem_pressure_pages,max_notsent_mib,min_busy_cwnd,"
      "max_flat_seconds,stall")
stalls = 0
for r in rows:
    stall = r[5] == "failed" or r[7] not in ("", "0") or float(r[5]) > 2 * med
    stalls += stall
    print(",".join(r + ["yes" if stall else "no"]))
print(f"stall-count: {stalls} stalls in {len(rows)} runs (median {med:.1f} s)", file=sys.stderr)
EOF
