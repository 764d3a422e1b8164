#!/usr/bin/env bash
# Interleaved pushes of two or more dmover builds (or one build with different `cp`
# options) over one `dmover netlab` link: the A/B behind most "before / after" rows
# in docs/benchmarks.md. Each variant runs its own `dmover serve`; every run drops the
# page cache first and counts the final `sync`. Copies are kept until the end (ext4
# frees thousands of deleted files in the background for tens of seconds, slowing
# the next run: docs/benchmarks.md, "Tiny at short RTTs").
#
#   RTT=50 LOSS=0.01% DATASET=large:0.125 RUNS=5 bash docs/bench/ab-push.sh \
#       old=/path/to/old/dmover new=target/release/dmover "p4=target/release/dmover:-P 4"
#
# Variants: NAME=BINARY[:CP OPTIONS]. Settings (environment): RTT (ms, 50), LOSS (0),
# RATE (1gbit), DATASET (profile:scale for `dmover bench mkdata`, tiny:1), RUNS (5),
# WORK (a directory on the disk under test; default /var/tmp), DIRECTION (push; pull:
# each run pulls the server's copy of the dataset instead), LAB_ARGS (more `dmover netlab
# up` options, e.g. `--tcp-buffer-max 4M` for hosts with Linux's default buffer
# limits). Needs root.
# Run 0 (not reported) pins each variant's server key with a one-file copy: a push to
# a server whose key was pinned earlier sends early data (protocol version 8), as in
# use; the very first push to a server waits for its session.
# Output: variant,run,seconds,cpu_client_s,cpu_server_s on stdout; medians on stderr.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: ab-push.sh NAME=BINARY[:CP OPTIONS]..." >&2; exit 2; }
RTT=${RTT:-50}
LOSS=${LOSS:-0}
RATE=${RATE:-1gbit}
DATASET=${DATASET:-tiny:1}
RUNS=${RUNS:-5}
DIRECTION=${DIRECTION:-push}
LAB=ab$$
A=dmnl-$LAB-a B=dmnl-$LAB-b FAR=10.200.0.2 PORT=7794
W=$(mktemp -d "${WORK:-/var/tmp}/dmover-ab.XXXXXX")
. "$(dirname "${BASH_SOURCE[0]}")/fs-note.sh"
. "$(dirname "${BASH_SOURCE[0]}")/variants.sh"
note_recently_deleted "$W"
parse_variants "$@"
first=${bins[0]}

cleanup() {
    [ -f "$W/serve.pid" ] && kill "$(cat "$W/serve.pid")" 2>/dev/null || true
    "$first" netlab down --name "$LAB" >/dev/null 2>&1 || true
    rm -rf "$W"
}
trap cleanup EXIT
now() { python3 -c 'import time; print(f"{time.monotonic():.6f}")'; }

head -c 32 /dev/urandom | base64 >"$W/token"
chmod 600 "$W/token"
mkdir -p "$W/srv" "$W/pulled"
# A pull's server serves the work directory: the dataset is its `src`.
ROOT=$W/srv
[ "$DIRECTION" = pull ] && ROOT=$W
"$first" bench mkdata --profile "${DATASET%%:*}" --scale "${DATASET#*:}" "$W/src" >/dev/null
"$first" netlab up --name "$LAB" --rtt "${RTT}ms" --rate "$RATE" --loss "$LOSS" ${LAB_ARGS:-} >/dev/null
{
echo "variant,run,seconds,cpu_client_s,cpu_server_s"
for run in $(seq 0 "$RUNS"); do
    for i in "${!names[@]}"; do
        bin=${bins[$i]}
        read -ra args <<<"${opts[$i]}"
        ip netns exec "$B" "$bin" serve --root "$ROOT" --listen "$FAR:$PORT" \
            --token-file "$W/token" >"$W/serve.log" 2>&1 &
        sp=$!
        echo "$sp" >"$W/serve.pid"
        for _ in $(seq 50); do
            ip netns exec "$A" bash -c "exec 3<>/dev/tcp/$FAR/$PORT" 2>/dev/null && break
            sleep 0.1
        done
        from=$W/src to=dmover://$FAR:$PORT/${names[$i]}-$run
        [ "$run" = 0 ] && from=$W/token
        if [ "$DIRECTION" = pull ]; then
            from=dmover://$FAR:$PORT/src to=$W/pulled/${names[$i]}-$run
            [ "$run" = 0 ] && from=dmover://$FAR:$PORT/token
        fi
        sync
        echo 3 >/proc/sys/vm/drop_caches
        t0=$(now)
        ip netns exec "$A" /usr/bin/time -o "$W/cp.time" -f "%U %S" "$bin" cp \
            --token-file "$W/token" --known-hosts "$W/kh-$i" "${args[@]}" "$from" "$to" \
            >/dev/null 2>"$W/cp.err" ||
            { tail -3 "$W/cp.err" >&2; continue; }
        sync
        t1=$(now)
        # The server's CPU time so far (it served this copy only), from /proc.
        server=$(awk -v hz="$(getconf CLK_TCK)" '{printf "%.2f", ($14 + $15) / hz}' "/proc/$sp/stat")
        kill "$sp"
        wait "$sp" 2>/dev/null || true
        rm -f "$W/serve.pid"
        client=$(tail -1 "$W/cp.time" | awk '{printf "%.2f", $1 + $2}')
        [ "$run" = 0 ] && continue
        echo "${names[$i]},$run,$(python3 -c "print(f'{$t1 - $t0:.3f}')"),$client,$server"
    done
done
} | tee "$W/rows.csv"
medians "$W/rows.csv"
