#!/usr/bin/env bash
# The self-tuning stream count against pinned counts over emulated long links.
# For each lab (RTT, rate, the hosts' tcp_wmem/tcp_rmem maximum), pushes one file
# from host a to a dmover server in host b (both on tmpfs), ROUNDS times each way of
# setting the streams, interleaved: -P 4 (the untuned default), tuned (no -P), -P 16.
# Prints CSV: lab,rtt,rate,buf_max,mode,round,seconds,gbit_per_s,steady_gbit_per_s,tuned_streams,settled_seconds
# Usage: docs/bench/tune-netlab.sh [DMOVER_BINARY]   (as root; env ROUNDS, SIZE, LABS)
set -euo pipefail
B=${1:-target/release/dmover}
B=$(readlink -f "$B")
ROUNDS=${ROUNDS:-3}
SIZE=${SIZE:-2000M}
# rtt:rate:buf_max; 4M is Linux's default tcp_wmem maximum.
LABS=${LABS:-"200ms:1gbit:4M 50ms:1gbit:4M 200ms:1gbit:64M"}
W=$(mktemp -d /dev/shm/dmover-tune.XXXXXX)
cleanup() {
    pkill -f "serve --root $W/srv" 2>/dev/null || true
    "$B" netlab down --name tunebench >/dev/null 2>&1 || true
    rm -rf "$W"
}
trap cleanup EXIT
mkdir -p "$W/src" "$W/srv" "$W/home"
head -c "$SIZE" /dev/zero > "$W/src/big"
head -c 32 /dev/urandom | base64 > "$W/token"
chmod 600 "$W/token"
export HOME=$W/home
echo "lab,rtt,rate,buf_max,mode,round,seconds,gbit_per_s,steady_gbit_per_s,tuned_streams,settled_seconds"
for lab in $LABS; do
    IFS=: read -r rtt rate buf <<<"$lab"
    "$B" netlab down --name tunebench >/dev/null 2>&1 || true
    "$B" netlab up --name tunebench --rtt "$rtt" --rate "$rate" --tcp-buffer-max "$buf" >/dev/null
    ip netns exec dmnl-tunebench-b "$B" serve --root "$W/srv" --listen 10.200.0.2:7700 \
        --token-file "$W/token" >"$W/serve.log" 2>&1 &
    sleep 1
    for round in $(seq 1 "$ROUNDS"); do
        for mode in P4 tuned P16; do
            case $mode in
                P4) args=(-P 4) ;;
                P16) args=(-P 16) ;;
                tuned) args=() ;;
            esac
            out=$(ip netns exec dmnl-tunebench-a "$B" cp --token-file "$W/token" \
                --known-hosts "$W/kh" --json "${args[@]}" "$W/src/big" \
                dmover://10.200.0.2/big 2>/dev/null || true)
            python3 - "$lab" "$rtt" "$rate" "$buf" "$mode" "$round" "$out" <<'PY'
import json, sys
lab, rtt, rate, buf, mode, rnd, out = sys.argv[1:]
try:
    d = json.loads(out)
except ValueError:
    print(f"{lab},{rtt},{rate},{buf},{mode},{rnd},,,,,")
    sys.exit()
t = d.get("tuning") or {}
f = lambda v: "" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))
print(",".join([lab, rtt, rate, buf, mode, rnd, f(d["seconds"]), f(d["gbit_per_s"]),
                 f(d.get("steady_gbit_per_s")), f(t.get("streams")), f(t.get("settled_seconds"))]))
PY
        done
    done
    pkill -f "serve --root $W/srv" || true
    sleep 0.5
done
