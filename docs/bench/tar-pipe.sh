#!/usr/bin/env bash
# The plainest copy of a tree over a link, against dmover's: N `tar c | TCP | tar x`
# pipelines at once (the files dealt round-robin; no checksums, no staging names, no
# TLS, no resume), interleaved with `dmover cp` pushes to a `dmover serve`, over one
# `dmover netlab` link, cold cache, `sync` counted in both. It asks what the machine
# gives a copy of many small files when both ends (and the lab's forwarder) share
# its cores and its disk.
#
#   DMOVER=target/release/dmover SRC=DIR bash docs/bench/tar-pipe.sh > tar-pipe.csv
#
# Settings (environment): SRC (a tree; e.g. `dmover bench mkdata --profile tiny`),
# RTTS (0), RATE (1gbit), RUNS (5), STREAMS (8: tar pipelines), WORK (a directory on
# the disk under test; default /var/tmp). Copies are kept until the end (ext4 frees
# thousands of deleted files' blocks and inodes in the background for tens of
# seconds, slowing the next run). Needs root, python3. Output:
#   rtt_ms,tool,run,seconds,files
set -euo pipefail
DMOVER=$(realpath "${DMOVER:-$(command -v dmover)}")
SRC=$(realpath "${SRC:?a source tree}")
RTTS=${RTTS:-0}
RATE=${RATE:-1gbit}
RUNS=${RUNS:-5}
STREAMS=${STREAMS:-8}
LAB=tp$$
A=dmnl-$LAB-a B=dmnl-$LAB-b FAR=10.200.0.2 PORT=7792 TPORT=17992
W=$(mktemp -d "${WORK:-/var/tmp}/dmover-tarpipe.XXXXXX")

cleanup() {
    [ -f "$W/serve.pid" ] && kill "$(cat "$W/serve.pid")" 2>/dev/null || true
    "$DMOVER" netlab down --name "$LAB" >/dev/null 2>&1 || true
    rm -rf "$W"
}
trap cleanup EXIT
cold() { sync; echo 3 >/proc/sys/vm/drop_caches; }
now() { python3 -c 'import time; print(f"{time.monotonic():.6f}")'; }

# The receiver: accepts STREAMS connections and hands each socket to a `tar x`.
cat >"$W/recv.py" <<'PY'
import socket, subprocess, sys
host, port, n, dest = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind((host, port)); l.listen(64)
print("ready", flush=True)
tars = []
for _ in range(n):
    c, _ = l.accept()
    tars.append((subprocess.Popen(["tar", "xf", "-", "-C", dest], stdin=c.fileno()), c))
sys.exit(max(p.wait() for p, _ in tars))
PY

head -c 32 /dev/urandom | base64 >"$W/token"
chmod 600 "$W/token"
mkdir -p "$W/srv" "$W/tar"
(cd "$SRC" && find . -type f) >"$W/files"
(cd "$SRC" && find . -mindepth 1 -type d) >"$W/dirs"
split -n "r/$STREAMS" "$W/files" "$W/part."
files=$(wc -l <"$W/files")

echo "rtt_ms,tool,run,seconds,files"
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
        # tar: the directories made first (as dmover's sink does), so the pipelines
        # do not race to make them.
        dest=$W/tar/$rtt-$run
        mkdir -p "$dest"
        (cd "$dest" && xargs -d '\n' mkdir -p <"$W/dirs")
        coproc RECV { ip netns exec "$B" python3 "$W/recv.py" "$FAR" "$TPORT" "$STREAMS" "$dest"; }
        read -r _ <&"${RECV[0]}"
        cold
        t0=$(now)
        pids=()
        for p in "$W"/part.*; do
            ip netns exec "$A" bash -c "cd '$SRC' && exec tar cf - -T '$p' >/dev/tcp/$FAR/$TPORT" &
            pids+=($!)
        done
        wait "${pids[@]}"
        wait "$RECV_PID"
        sync
        t1=$(now)
        got=$(find "$dest" -type f | wc -l)
        echo "$rtt,tar-P$STREAMS,$run,$(python3 -c "print(f'{$t1 - $t0:.3f}')"),$got"
        # dmover
        cold
        t0=$(now)
        ip netns exec "$A" "$DMOVER" cp --token-file "$W/token" --known-hosts "$W/kh" \
            "$SRC" "dmover://$FAR:$PORT/$rtt-$run" >/dev/null 2>"$W/cp.err" || tail -3 "$W/cp.err" >&2
        sync
        t1=$(now)
        got=$(find "$W/srv/$rtt-$run" -type f | wc -l)
        echo "$rtt,dmover,$run,$(python3 -c "print(f'{$t1 - $t0:.3f}')"),$got"
        echo "tar-pipe: $rtt ms run $run of $RUNS ($files files)" >&2
    done
    kill "$(cat "$W/serve.pid")" 2>/dev/null || true
    rm -f "$W/serve.pid"
    "$DMOVER" netlab down --name "$LAB" >/dev/null
done
