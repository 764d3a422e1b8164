#!/usr/bin/env bash
# Issue 13's "reaches 90 % of its final rate within 10 s on transfers longer than 30 s":
# pushes of a large dataset over `dmover netlab` links, with `--progress ndjson` every
# 0.5 s, one CSV line per run on stdout:
#   rtt_ms,mode,run,seconds,bytes,final_gbit_per_s,t90_s,streams_end
# final = the rate between 50 % and 95 % of the bytes; t90 = the end of the first 1 s
# window (from the progress lines) whose rate is at least 90 % of final.
#
#   DMOVER=target/release/dmover RTTS="50 200" bash docs/bench/ramp-time.sh > ramp.csv
#
# Settings (environment): RTTS (50 200), RATE (1gbit), RUNS (3), SCALE (0.5: the
# `large` profile's 8 × 512 MiB, 36 s at 1 Gbit/s), MODES ("tuned default": no -P,
# and -P 4), WORK (/var/tmp). Needs root, python3.
set -euo pipefail
DMOVER=$(realpath "${DMOVER:-$(command -v dmover)}")
RTTS=${RTTS:-50 200}
RATE=${RATE:-1gbit}
RUNS=${RUNS:-3}
SCALE=${SCALE:-0.5}
MODES=${MODES:-tuned default}
LAB=rt$$
A=dmnl-$LAB-a B=dmnl-$LAB-b FAR=10.200.0.2 PORT=7796
W=$(mktemp -d "${WORK:-/var/tmp}/dmover-ramp.XXXXXX")
cleanup() {
    [ -f "$W/serve.pid" ] && kill "$(cat "$W/serve.pid")" 2>/dev/null || true
    "$DMOVER" netlab down --name "$LAB" >/dev/null 2>&1 || true
    rm -rf "$W"
}
trap cleanup EXIT
head -c 32 /dev/urandom | base64 >"$W/token"
chmod 600 "$W/token"
mkdir -p "$W/srv"
"$DMOVER" bench mkdata --profile large --scale "$SCALE" "$W/src" >/dev/null
for rtt in $RTTS; do
    "$DMOVER" netlab up --name "$LAB" --rtt "${rtt}ms" --rate "$RATE" >/dev/null
    ip netns exec "$B" "$DMOVER" serve --root "$W/srv" --listen "$FAR:$PORT" \
        --token-file "$W/token" >"$W/serve.log" 2>&1 &
    echo $! >"$W/serve.pid"
    for _ in $(seq 50); do
        ip netns exec "$A" bash -c "exec 3<>/dev/tcp/$FAR/$PORT" 2>/dev/null && break
        sleep 0.1
    done
    for run in $(seq 1 "$RUNS"); do
        for mode in $MODES; do
            case $mode in
                tuned) args=() ;;
                default) args=(-P 4) ;;
            esac
            sync
            echo 3 >/proc/sys/vm/drop_caches
            ip netns exec "$A" "$DMOVER" cp --token-file "$W/token" --known-hosts "$W/kh" \
                --progress ndjson --progress-interval 500ms "${args[@]}" "$W/src" \
                "dmover://$FAR:$PORT/c" >"$W/lines" 2>"$W/cp.err" || tail -3 "$W/cp.err" >&2
            rm -rf "${W:?}/srv/c"
            python3 - "$rtt" "$mode" "$run" "$W/lines" <<'PY'
import json, sys
rtt, mode, run, path = sys.argv[1:]
lines = [json.loads(l) for l in open(path) if l.startswith("{")]
prog = [(l["seconds"], l["bytes_sent"]) for l in lines if l.get("type") == "progress"]
summ = [l for l in lines if l.get("type") == "summary"][-1]
total = summ["bytes"]
if not summ.get("ok") or not prog:
    print(f"{rtt},{mode},{run},,,,,", flush=True)
    raise SystemExit(0)
def at(frac):
    for t, b in prog:
        if b >= frac * total:
            return t, b
    return prog[-1]
(t50, b50), (t95, b95) = at(0.5), at(0.95)
final = (b95 - b50) * 8 / (t95 - t50) if t95 > t50 else 0.0
t90 = ""
for i, (t, b) in enumerate(prog):
    back = [p for p in prog[:i] if p[0] <= t - 1.0]
    if back:
        t0, b0 = back[-1]
        if (b - b0) * 8 / (t - t0) >= 0.9 * final:
            t90 = f"{t:.1f}"
            break
streams = (summ.get("tuning") or {}).get("streams", summ.get("streams"))
print(f"{rtt},{mode},{run},{summ['seconds']:.2f},{total},{final / 1e9:.3f},{t90},{streams}", flush=True)
PY
        done
    done
    kill "$(cat "$W/serve.pid")" 2>/dev/null || true
    rm -f "$W/serve.pid"
    sleep 0.5
    "$DMOVER" netlab down --name "$LAB" >/dev/null
done
