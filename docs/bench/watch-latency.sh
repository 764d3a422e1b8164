#!/usr/bin/env bash
# `dmover sync --watch` latency (issue 15): a writer in host a makes RATE files/s of SIZE
# for SECONDS into a watched directory; a poller in host b (the server's side) sees each
# final name appear in the mirror. Lag of a file = its appearance at b minus the end of
# its close() at a (one clock: both namespaces are on this host), quiet time included.
# Also the watcher's CPU while idle (10 s after the writer stops).
# Prints CSV lines: lab,file,bytes,lag_ms; then a summary line to stderr.
# Usage: docs/bench/watch-latency.sh [DMOVER_BINARY]  (as root; env RTT, RATE_LINK,
#        FILES_PER_S, SIZE_MIB, DURATION (seconds), QUIET)
set -euo pipefail
B=${1:-target/release/dmover}
B=$(readlink -f "$B")
RTT=${RTT:-50ms}
RATE_LINK=${RATE_LINK:-1gbit}
FPS=${FILES_PER_S:-50}
SIZE_MIB=${SIZE_MIB:-1}
SECONDS_RUN=${DURATION:-20}
QUIET=${QUIET:-}
W=$(mktemp -d /var/tmp/dmover-watch.XXXXXX)
cleanup() {
    [ -n "${WPID:-}" ] && kill "$WPID" 2>/dev/null || true
    pkill -f "serve --root $W/srv" 2>/dev/null || true
    "$B" netlab down --name watchlat >/dev/null 2>&1 || true
    rm -rf "$W"
}
trap cleanup EXIT
mkdir -p "$W/src" "$W/srv" "$W/home"
head -c 32 /dev/urandom | base64 > "$W/token"
chmod 600 "$W/token"
export HOME=$W/home
"$B" netlab down --name watchlat >/dev/null 2>&1 || true
"$B" netlab up --name watchlat --rtt "$RTT" --rate "$RATE_LINK" >/dev/null
ip netns exec dmnl-watchlat-b "$B" serve --root "$W/srv" --listen 10.200.0.2:7700 \
    --token-file "$W/token" >"$W/serve.log" 2>&1 &
sleep 1
qt=()
[ -n "$QUIET" ] && qt=(--quiet-time "$QUIET")
ip netns exec dmnl-watchlat-a "$B" sync --watch "${qt[@]}" --token-file "$W/token" \
    --known-hosts "$W/kh" --json "$W/src" dmover://10.200.0.2/mirror \
    >"$W/watch.ndjson" 2>"$W/watch.log" &
WPID=$!
# Wait for the catch-up (the mirror exists).
for _ in $(seq 1 100); do [ -d "$W/srv/mirror" ] && break; sleep 0.1; done
python3 - "$W" "$FPS" "$SIZE_MIB" "$SECONDS_RUN" "$RTT" <<'PY'
import os, sys, time, threading
w, fps, size_mib, secs, rtt = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
src, dst = os.path.join(w, "src"), os.path.join(w, "srv", "mirror")
n = int(fps * secs)
closed, seen = {}, {}
data = os.urandom(size_mib << 20)
done = threading.Event()
def poll():
    while not done.is_set() or len(seen) < len(closed):
        try:
            names = os.listdir(dst)
        except FileNotFoundError:
            names = []
        t = time.monotonic()
        for name in names:
            if name.startswith("f") and name not in seen:
                seen[name] = t
        if done.is_set() and time.monotonic() - last_close[0] > 60:
            break
        time.sleep(0.005)
last_close = [time.monotonic()]
p = threading.Thread(target=poll); p.start()
t0 = time.monotonic()
for i in range(n):
    due = t0 + i / fps
    d = due - time.monotonic()
    if d > 0:
        time.sleep(d)
    name = f"f{i:06d}"
    with open(os.path.join(src, name), "wb") as f:
        f.write(data)
    closed[name] = time.monotonic()
    last_close[0] = closed[name]
done.set(); p.join()
lags = sorted((seen[k] - closed[k]) * 1000 for k in closed if k in seen)
for k in sorted(closed):
    if k in seen:
        print(f"{rtt},{k},{size_mib << 20},{(seen[k]-closed[k])*1000:.1f}")
q = lambda p: lags[min(len(lags) - 1, int(p * len(lags)))] if lags else float("nan")
print(f"summary rtt={rtt} files={n} arrived={len(lags)} lag_ms p50={q(0.5):.0f} p90={q(0.9):.0f} "
      f"p99={q(0.99):.0f} max={lags[-1] if lags else float('nan'):.0f}", file=sys.stderr)
PY
# Idle CPU of the watcher: clock ticks over 10 s with nothing to do.
t1=$(awk '{print $14+$15}' /proc/$WPID/stat)
sleep 10
t2=$(awk '{print $14+$15}' /proc/$WPID/stat)
echo "idle: $((t2 - t1)) clock ticks (of $(getconf CLK_TCK)/s) in 10 s" >&2
kill -TERM "$WPID"; wait "$WPID" || true; WPID=
