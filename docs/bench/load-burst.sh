#!/bin/bash
# N `dmover cp` clients started at once against one `dmover serve` on loopback
# (docs/benchmarks.md "Under load"). Usage: DMOVER=path/to/dmover N=256 bash load-burst.sh [CLIENT OPTIONS...]
# Prints: clients, failed, drain seconds, busy answers, server peak RSS (kB), server threads.
set -u
DMOVER=${DMOVER:-dmover}
N=${N:-256}
W=$(mktemp -d)
trap 'kill $SRV 2>/dev/null; rm -rf "$W"' EXIT
mkdir -p "$W/root" "$W/src/a" "$W/src/b"
for i in $(seq 0 9); do
  head -c $((i * 10 * 1024)) /dev/urandom > "$W/src/a/f$i"
  head -c $((i * 10 * 1024)) /dev/urandom > "$W/src/b/f$i"
done
"$DMOVER" serve --root "$W/root" --listen 127.0.0.1:0 --state-dir "$W/state" > "$W/srv.out" 2> "$W/srv.log" &
SRV=$!
while ! grep -q "listening on" "$W/srv.out"; do sleep 0.05; done
ADDR=$(sed -n 's/^dmover: listening on //p' "$W/srv.out")
start=$(date +%s.%N)
for i in $(seq 1 "$N"); do
  DMOVER_KNOWN_HOSTS="$W/kh$i" "$DMOVER" cp --quiet "$@" "$W/src" "dmover://$ADDR/d$i" > /dev/null 2> "$W/c$i.err" &
done
failed=0
for job in $(jobs -p); do
  [ "$job" = "$SRV" ] && continue
  wait "$job" || failed=$((failed + 1))
done
end=$(date +%s.%N)
busy=$(cat "$W"/c*.err | grep -c "busy" || true)
rss=$(grep VmHWM /proc/$SRV/status | awk '{print $2}')
threads=$(grep Threads /proc/$SRV/status | awk '{print $2}')
echo "clients=$N failed=$failed drain_s=$(echo "$end - $start" | bc) busy_lines=$busy server_peak_rss_kB=$rss server_threads=$threads"
