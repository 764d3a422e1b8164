#!/usr/bin/env bash
# Interleaved pulls of two or more dmover builds from servers on loopback (no emulated
# link, no forwarder): what a change does to a pull where the link is not the limit.
# Each variant runs its own `dmover serve`; every run drops the page cache first,
# pulls into a directory of its own and counts the final `sync`; the copies are
# deleted at the end (ext4 without a journal slows the runs started within minutes of
# a mass deletion: docs/benchmarks.md, "The resume journal's commits off the disk
# threads").
#
#   DATASET=flat:200:1000:100 RUNS=5 PIN=1 bash docs/bench/pull-loopback.sh \
#       new=target/release/dmover old=/path/to/old/dmover "c256=target/release/dmover:--chunk 256K"
#
# Variants: NAME=BINARY[:CP OPTIONS]. Settings (environment): DATASET (profile:scale for `dmover
# bench mkdata`, or flat:DIRS:FILES:BYTES, DIRS directories of FILES files of BYTES
# bytes; tiny:1), RUNS (5), PIN (1: each server on CPU 0 and each client on CPU 1, as
# two machines would not share their cores), WORK (default /var/tmp). Needs root (to
# drop the page cache).
# Output: variant,run,seconds on stdout; medians on stderr.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: pull-loopback.sh NAME=BINARY..." >&2; exit 2; }
DATASET=${DATASET:-tiny:1}
RUNS=${RUNS:-5}
PIN=${PIN:-0}
W=$(mktemp -d "${WORK:-/var/tmp}/dmover-lo.XXXXXX")
. "$(dirname "${BASH_SOURCE[0]}")/fs-note.sh"
. "$(dirname "${BASH_SOURCE[0]}")/variants.sh"
note_recently_deleted "$W"
parse_variants "$@"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$W"
}
trap cleanup EXIT
on() { if [ "$PIN" = 1 ]; then taskset -c "$1" "${@:2}"; else "${@:2}"; fi; }

case $DATASET in
flat:*)
    IFS=: read -r _ dirs files bytes <<<"$DATASET"
    python3 - "$W/src" "$dirs" "$files" "$bytes" <<'PY'
import os, sys
root, dirs, files, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
data = b"x" * size
for d in range(dirs):
    p = os.path.join(root, f"d{d:04}")
    os.makedirs(p)
    for f in range(files):
        with open(os.path.join(p, f"f{f:06}"), "wb") as fh:
            fh.write(data)
PY
    ;;
*) "${bins[0]}" bench mkdata --profile "${DATASET%%:*}" --scale "${DATASET#*:}" "$W/src" >/dev/null ;;
esac
head -c 32 /dev/urandom | base64 >"$W/token"
chmod 600 "$W/token"
pin0=()
[ "$PIN" = 1 ] && pin0=(taskset -c 0)
for i in "${!bins[@]}"; do
    # Started directly (not through `on`, whose subshell would stand between its pid
    # and the server's).
    "${pin0[@]}" "${bins[$i]}" serve --root "$W" --listen "127.0.0.1:$((7820 + i))" \
        --token-file "$W/token" >"$W/serve-$i.log" 2>&1 &
    pids+=("$!")
done
for i in "${!bins[@]}"; do
    for _ in $(seq 50); do
        bash -c "exec 3<>/dev/tcp/127.0.0.1/$((7820 + i))" 2>/dev/null && break
        sleep 0.1
    done
done
now() { python3 -c 'import time; print(f"{time.monotonic():.6f}")'; }
{
echo "variant,run,seconds"
# Run 0 (not reported) pins each server's key.
for run in $(seq 0 "$RUNS"); do
    for i in "${!bins[@]}"; do
        read -ra args <<<"${opts[$i]}"
        from=dmover://127.0.0.1:$((7820 + i))/src
        [ "$run" = 0 ] && from=dmover://127.0.0.1:$((7820 + i))/token
        sync
        echo 3 >/proc/sys/vm/drop_caches
        t0=$(now)
        on 1 "${bins[$i]}" cp --token-file "$W/token" --known-hosts "$W/kh-$i" "${args[@]}" \
            "$from" "$W/out-$run-$i" >/dev/null 2>"$W/cp.err" ||
            { tail -3 "$W/cp.err" >&2; continue; }
        sync
        t1=$(now)
        [ "$run" = 0 ] && continue
        echo "${names[$i]},$run,$(python3 -c "print(f'{$t1 - $t0:.3f}')")"
    done
done
} | tee "$W/rows.csv"
medians "$W/rows.csv"
