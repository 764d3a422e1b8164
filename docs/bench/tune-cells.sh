#!/usr/bin/env bash
# Issue 13's cells: the tuned default against today's fixed default and the best fixed
# setting of a sweep, and every dataset's wall time against its bound, over
# `dmover netlab` links.
#
# For each link (RTT, loss) and dataset, on this machine's disk (not tmpfs: the cold
# read and the sync count):
#   bound  the longest of (a) raw TCP: a Python sender in host a and receiver in host b
#          moving the same number of bytes memory to memory over STREAMS_RAW connections,
#          timed from the sender's start until the receiver holds every byte (not
#          iperf3 -n, whose clock stops when the sender has written), best of cubic and
#          bbr and of the stream counts; (b) the local cold-cache read of the dataset
#          (eight `cat`s at once);
#          (c) the local write of it (from tmpfs) with sync. Also measured, as the
#          bound of this machine where both ends share its cores and its disk:
#          (d) the local copy, disk to disk on this machine, cold cache, sync counted,
#          16 `cp -a` at once (`local-copy-P16`); and (e) both at once: the best raw
#          TCP of (a) and that local copy started together, timed until both end
#          (`raw-and-copy`, BOTH_RUNS times): on this machine the link's forwarder,
#          the network stacks and the file system share two cores, so the work of
#          (a) and (d) together takes longer than either alone (a comparison, not a
#          bound: those tools spend more CPU on it than dmover does).
#   modes  interleaved, RUNS times: `tuned` (no -P, no --chunk), `default` (-P 4: the
#          fixed default before issue 13, chunk as cp picks it), `best` (BEST_<dataset>,
#          the best fixed point of a `dmover bench transfer` sweep). Each a push from
#          host a to a `dmover serve` in host b, cold cache, `sync` counted.
# One CSV line per measurement on stdout:
#   rtt_ms,loss,dataset,bytes,kind,mode,run,seconds,streams_end,settled_s,cpu_s
# cpu_s: the CPU time the whole machine spent while it ran (every core's user, system,
# interrupt and steal time in /proc/stat: both ends, the link's forwarder, the kernel's
# writeback), for this machine's CPU bound: the parts of the bound (a)-(c) done one
# after the other spent that much CPU, which a copy, doing all three, needs at least;
# on CORES cores it takes at least their sum / CORES of wall time. The raw TCP tool's
# own start-up (two Pythons) is measured alone (`tool-start-raw-tcp`, one byte) and
# left out of it by the summary.
# Summarise with docs/bench/tune-cells-summary.py (medians, ratios, SVG plot).
#
#   DMOVER=target/release/dmover RTTS="0 50 200" bash docs/bench/tune-cells.sh > cells.csv
#
# Settings (environment): RTTS (0 50 200), LOSSES (0; e.g. "0 0.01%"), RATE (1gbit),
# RUNS (5), DATASETS ("tiny:1 losf:0.5 large:0.125": profile:scale), BEST_tiny,
# BEST_losf, BEST_large (`cp` options; default "-P 8 --chunk 4M"), STREAMS_RAW ("4 8"),
# MODES ("tuned default best"; empty: the bounds alone), BOTH_RUNS (3), KEEP_FILES (100: copies of
# datasets with more files are kept until the end, see below; mind the disk space),
# WORK (a directory on the disk under test; default /var/tmp), LAB_ARGS (more `dmover
# netlab up` options, e.g. `--tcp-buffer-max 4M`). Needs root, python3.
set -euo pipefail
DMOVER=$(realpath "${DMOVER:-$(command -v dmover)}")
RTTS=${RTTS:-0 50 200}
LOSSES=${LOSSES:-0}
RATE=${RATE:-1gbit}
RUNS=${RUNS:-5}
DATASETS=${DATASETS:-tiny:1 losf:0.5 large:0.125}
STREAMS_RAW=${STREAMS_RAW:-4 8}
MODES=${MODES-tuned default best}
KEEP_FILES=${KEEP_FILES:-100}
BOTH_RUNS=${BOTH_RUNS:-3}
LAB=tc$$
A=dmnl-$LAB-a B=dmnl-$LAB-b FAR=10.200.0.2 PORT=7791
W=$(mktemp -d "${WORK:-/var/tmp}/dmover-cells.XXXXXX")
SHM=$(mktemp -d /dev/shm/dmover-cells.XXXXXX)
. "$(dirname "${BASH_SOURCE[0]}")/fs-note.sh"
note_recently_deleted "$W"
RAW=$(dirname "$(realpath "$0")")/raw-tcp.py

cleanup() {
    [ -f "$W/serve.pid" ] && kill "$(cat "$W/serve.pid")" 2>/dev/null || true
    "$DMOVER" netlab down --name "$LAB" >/dev/null 2>&1 || true
    rm -rf "$W" "$SHM"
}
trap cleanup EXIT

cold() { sync; echo 3 >/proc/sys/vm/drop_caches; }
# Timestamps and CPU readings without starting a Python: the harness's own CPU stays
# out of what it measures.
now() { printf '%s\n' "$EPOCHREALTIME"; }
HZ=$(getconf CLK_TCK)
busy() { since 0; }
since() { awk -v a="$1" -v hz="$HZ" '/^cpu / {printf "%.3f\n", ($2 + $3 + $4 + $7 + $8 + $9) / hz - a}' /proc/stat; }
say() { echo "tune-cells: $*" >&2; }

head -c 32 /dev/urandom | base64 >"$W/token"
chmod 600 "$W/token"
mkdir -p "$W/srv"


raw_tcp() { # BYTES STREAMS CC -> seconds
    local bytes=$1 n=$2 cc=$3
    coproc RECV { ip netns exec "$B" python3 "$RAW" r "$FAR" 17991 "$n"; }
    read -r _ <&"${RECV[0]}"
    local start end
    start=$(ip netns exec "$A" python3 "$RAW" s "$FAR" 17991 "$n" "$bytes" "$cc")
    read -r end <&"${RECV[0]}"
    wait "$RECV_PID" 2>/dev/null || true
    awk -v a="$start" -v b="$end" 'BEGIN {printf "%.3f\n", b - a}'
}

serve() {
    ip netns exec "$B" "$DMOVER" serve --root "$W/srv" --listen "$FAR:$PORT" \
        --token-file "$W/token" >"$W/serve.log" 2>&1 &
    echo $! >"$W/serve.pid"
    for _ in $(seq 50); do
        ip netns exec "$A" bash -c "exec 3<>/dev/tcp/$FAR/$PORT" 2>/dev/null && return
        sleep 0.1
    done
    say "the server did not start"; cat "$W/serve.log" >&2; exit 1
}

# The server key pinned once, before any timed copy: a push to a server whose key was
# pinned earlier sends early data (protocol version 8), as in use.
pin() {
    [ -s "$W/kh" ] && return
    ip netns exec "$A" "$DMOVER" cp --token-file "$W/token" --known-hosts "$W/kh" \
        "$W/token" "dmover://$FAR:$PORT/pinned" >/dev/null 2>&1 || true
}

echo "rtt_ms,loss,dataset,bytes,kind,mode,run,seconds,streams_end,settled_s,cpu_s"
for ds in $DATASETS; do
    name=${ds%%:*} scale=${ds#*:}
    "$DMOVER" bench mkdata --profile "$name" --scale "$scale" "$W/src-$name" >/dev/null
done
for rtt in $RTTS; do
    for loss in $LOSSES; do
        "$DMOVER" netlab down --name "$LAB" >/dev/null 2>&1 || true
        "$DMOVER" netlab up --name "$LAB" --rtt "${rtt}ms" --rate "$RATE" --loss "$loss" ${LAB_ARGS:-} >/dev/null
        serve
        pin
        for ds in $DATASETS; do
            name=${ds%%:*}
            src=$W/src-$name
            bytes=$(find "$src" -type f -printf '%s\n' | awk '{s += $1} END {print s}')
            row() { echo "$rtt,$loss,$name,$bytes,$1,$2,$3,$4,${5:-},${6:-},${7:-}"; }
            # The bound. First what the raw TCP tool's two Pythons cost to start and
            # end (one byte): the CPU bound leaves it out.
            c0=$(busy)
            t=$(raw_tcp 1 1 cubic)
            cpu=$(since "$c0")
            row bound tool-start-raw-tcp 1 "$t" "" "" "$cpu"
            best_raw="" best_n="" best_cc=""
            for n in $STREAMS_RAW; do
                for cc in cubic bbr; do
                    c0=$(busy)
                    t=$(raw_tcp "$bytes" "$n" "$cc")
                    cpu=$(since "$c0")
                    row bound "raw-tcp-P$n-$cc" 1 "$t" "" "" "$cpu"
                    if [ -z "$best_raw" ] || python3 -c "import sys; sys.exit(not $t < $best_raw)"; then
                        best_raw=$t best_n=$n best_cc=$cc
                    fi
                done
            done
            # Eight readers, as dmover's disk threads read several files at once.
            cold
            c0=$(busy)
            t0=$(now); find "$src" -type f -print0 | xargs -0 -P 8 -n 256 cat >/dev/null; t1=$(now)
            cpu=$(since "$c0")
            row bound cold-read-P8 1 "$(python3 -c "print(f'{$t1 - $t0:.3f}')")" "" "" "$cpu"
            rm -rf "$SHM/ds"; cp -a "$src" "$SHM/ds"; cold
            c0=$(busy)
            t0=$(now); cp -a "$SHM/ds" "$W/local-write-$rtt-$loss-$name"; sync; t1=$(now)
            cpu=$(since "$c0")
            row bound sync-write 1 "$(python3 -c "print(f'{$t1 - $t0:.3f}')")" "" "" "$cpu"
            rm -rf "$SHM/ds"
            files=$(find "$src" -type f | wc -l)
            if [ "$files" -le "$KEEP_FILES" ]; then rm -rf "$W/local-write-$rtt-$loss-$name"; fi
            # Sixteen copiers, each given a sixteenth of the files (at least one).
            per=$(( (files + 15) / 16 )); lc=$W/local-copy-$rtt-$loss-$name
            mkdir -p "$lc"; cold
            c0=$(busy)
            t0=$(now)
            (cd "$src" && find . -type f -print0 | xargs -0 -P 16 -n "$per" cp -a --parents -t "$lc")
            sync; t1=$(now)
            cpu=$(since "$c0")
            row bound local-copy-P16 1 "$(python3 -c "print(f'{$t1 - $t0:.3f}')")" "" "" "$cpu"
            if [ "$files" -le "$KEEP_FILES" ]; then rm -rf "$lc"; fi
            # The best raw TCP and the local copy at once, until both have ended.
            for run in $(seq 1 "$BOTH_RUNS"); do
                lc=$W/both-$rtt-$loss-$name-$run
                mkdir -p "$lc"; cold
                c0=$(busy)
                t0=$(now)
                (cd "$src" && find . -type f -print0 | xargs -0 -P 16 -n "$per" cp -a --parents -t "$lc"; sync) &
                copier=$!
                raw_tcp "$bytes" "$best_n" "$best_cc" >/dev/null
                wait "$copier"
                t1=$(now)
                cpu=$(since "$c0")
                row bound raw-and-copy "$run" "$(python3 -c "print(f'{$t1 - $t0:.3f}')")" "" "" "$cpu"
                if [ "$files" -le "$KEEP_FILES" ]; then rm -rf "$lc"; fi
            done
            best_var=BEST_$name
            best=${!best_var:--P 8 --chunk 4M}
            for run in $(seq 1 "$RUNS"); do
                for mode in $MODES; do
                    case $mode in
                        tuned) args=() ;;
                        default) args=(-P 4) ;;
                        best) read -ra args <<<"$best" ;;
                    esac
                    dest=copy-$rtt-$loss-$name-$run-$mode
                    cold
                    c0=$(busy)
                    t0=$(now)
                    out=$(ip netns exec "$A" "$DMOVER" cp --token-file "$W/token" \
                        --known-hosts "$W/kh" --json "${args[@]}" "$src" \
                        "dmover://$FAR:$PORT/$dest" 2>"$W/cp.err" || true)
                    sync
                    t1=$(now)
                    cpu=$(since "$c0")
                    # ext4 skips inodes freed in the last minute when it allocates
                    # (`recently_deleted`): files created right after thousands were
                    # deleted cost twice the CPU (20 000 × 8 KiB: 1.4 → 2.5-3.7 s of
                    # the server's). On this VM's `discard` mount the deletion also
                    # leaves tens of seconds of discards behind (writing 20 000 files
                    # right after: 16 s instead of 1.3 s). So a dataset of many files
                    # is deleted at the end, not before the next run; a few large
                    # files go at once.
                    if [ "$files" -le "$KEEP_FILES" ]; then rm -rf "${W:?}/srv/$dest"; fi
                    python3 - "$t0" "$t1" "$out" "$(row dmover "$mode" "$run" X "" "" "$cpu")" <<'PY' || tail -3 "$W/cp.err" >&2
import json, sys
t0, t1, out, pre = sys.argv[1:]
d = json.loads(out)
if not d.get("ok"):
    raise SystemExit(1)
t = d.get("tuning") or {}
streams = t.get("streams", d.get("streams"))
settled = t.get("settled_seconds")
print(pre.replace(",X,,", f",{float(t1) - float(t0):.3f},{streams},{'' if settled is None else settled}"))
PY
                done
                say "$rtt ms loss $loss $name run $run of $RUNS"
            done
        done
        kill "$(cat "$W/serve.pid")" 2>/dev/null || true
        rm -f "$W/serve.pid"
        sleep 0.5
    done
done
