#!/bin/bash
# N `dmover cp` clients started at once against one `dmover serve` on loopback
# (docs/benchmarks.md "Under load"). Usage: DMOVER=path/to/dmover N=256 bash load-burst.sh [CLIENT OPTIONS...]
# TOKEN=1: the server requires a shared token (--token-file), the clients prove it.
# SERVE_ARGS="...": more options for `dmover serve` (e.g. --config FILE).
# Prints: clients, failed, drain seconds, busy answers, server peak RSS (kB), server
# threads, and (where nstat is installed) how much the kernel's counters of resets
# sent on close and accept-queue overflows grew, host-wide, during the run.
set -u
DMOVER=${DMOVER:-dmover}
N=${N:-256}
W=$(mktemp -d)
trap 'kill $SRV 2>/dev/null; rm -rf "$W"' EXIT
mkdir -p "$W/root" "$W/src/a" "$W/src/b"
AUTH=()
if [ "${TOKEN:-0}" = 1 ]; then
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$W/token"
  AUTH=(--token-file "$W/token")
fi
for i in $(seq 0 9); do
  head -c $((i * 10 * 1024)) /dev/urandom > "$W/src/a/f$i"
  head -c $((i * 10 * 1024)) /dev/urandom > "$W/src/b/f$i"
done
"$DMOVER" serve --root "$W/root" --listen 127.0.0.1:0 --state-dir "$W/state" "${AUTH[@]}" ${SERVE_ARGS:-} > "$W/srv.out" 2> "$W/srv.log" &
SRV=$!
while ! grep -q "listening on" "$W/srv.out"; do sleep 0.05; done
ADDR=$(sed -n 's/^dmover: listening on //p' "$W/srv.out")
command -v nstat > /dev/null && nstat -n
start=$(date +%s.%N)
for i in $(seq 1 "$N"); do
  DMOVER_KNOWN_HOSTS="$W/kh$i" "$DMOVER" cp --quiet "${AUTH[@]}" "$@" "$W/src" "dmover://$ADDR/d$i" > /dev/null 2> "$W/c$i.err" &
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
kernel=""
if command -v nstat > /dev/null; then
  kernel=$(nstat 2>/dev/null | awk '$1 ~ /TcpExt(TCPAbortOnClose|TCPAbortOnData|ListenOverflows)$/ {printf " %s=%s", $1, $2}')
fi
echo "clients=$N failed=$failed drain_s=$(echo "$end - $start" | bc) busy_lines=$busy server_peak_rss_kB=$rss server_threads=$threads$kernel"
if [ "$failed" -gt 0 ]; then
  echo "client errors:"; cat "$W"/c*.err | grep -i error | sed 's/127\.0\.0\.1:[0-9]*/SERVER/' | sort | uniq -c
fi
