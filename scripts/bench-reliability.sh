#!/usr/bin/env bash
# bench-reliability.sh: what the resume journal and --verify cost (issue 6). A/B on the
# same data in one run: `dmover cp` push to a server on loopback with the journal (the
# default), with --no-journal, and with --verify; variants interleaved within each
# repeat. Before each copy: remove the destination, sync, drop the page cache. Times
# the copy, then a `sync` (a copy is done when its data is on disk: without that the
# journal's syncfs calls would be charged to it alone).
#
# Usage: scripts/bench-reliability.sh   (run under: flock /work/bench.lock ...)
# Environment: DATASETS (default "tiny large"), SCALE_large (default 0.25: 2 x 1 GiB),
#   REPEATS (default 5), DATA (default /work/rl-benchdata), DMOVER (default
#   target/release/dmover), LISTEN (default 127.0.0.1:17906), OUT (default
#   bench-out/reliability-DATE).
# Output: $OUT/raw.csv (dataset,variant,repeat,copy_s,sync_s,total_s,bytes,files),
#   $OUT/summary.md (medians).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DATASETS=${DATASETS:-tiny large}
REPEATS=${REPEATS:-5}
DATA=${DATA:-/work/rl-benchdata}
DMOVER=${DMOVER:-$REPO/target/release/dmover}
LISTEN=${LISTEN:-127.0.0.1:17906}
OUT=${OUT:-$REPO/bench-out/reliability-$(date +%Y%m%d-%H%M%S)}
VARIANTS=(journal nojournal verify)
mkdir -p "$OUT" "$DATA/src" "$DATA/dst"
for d in $DATASETS; do
    if [[ ! -d $DATA/src/$d ]]; then
        scale_var="SCALE_$d"; scale=${!scale_var:-1}
        [[ $d == large ]] && scale=${SCALE_large:-0.25}
        "$DMOVER" bench mkdata "$DATA/src/$d" --profile "$d" --scale "$scale" >/dev/null
    fi
done
"$DMOVER" serve --root "$DATA/dst" --listen "$LISTEN" >"$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
sleep 0.5
echo "dataset,variant,repeat,copy_s,sync_s,total_s,bytes,files" >"$OUT/raw.csv"
now() { date +%s.%N; }
for d in $DATASETS; do
    for r in $(seq 1 "$REPEATS"); do
        for v in "${VARIANTS[@]}"; do
            rm -rf "${DATA:?}/dst/$d"
            sync
            echo 3 >/proc/sys/vm/drop_caches
            flags=()
            case $v in nojournal) flags=(--no-journal) ;; verify) flags=(--verify) ;; esac
            t0=$(now)
            "$DMOVER" cp --json "${flags[@]}" "$DATA/src/$d" "dmover://$LISTEN/" >"$OUT/last.json"
            t1=$(now)
            sync
            t2=$(now)
            bytes=$(sed -E 's/.*"bytes":([0-9]+).*/\1/' "$OUT/last.json")
            files=$(sed -E 's/.*"files":([0-9]+).*/\1/' "$OUT/last.json")
            awk -v d="$d" -v v="$v" -v r="$r" -v a="$t0" -v b="$t1" -v c="$t2" -v by="$bytes" -v f="$files" \
                'BEGIN { printf "%s,%s,%d,%.3f,%.3f,%.3f,%s,%s\n", d, v, r, b - a, c - b, c - a, by, f }' \
                >>"$OUT/raw.csv"
            tail -1 "$OUT/raw.csv"
        done
    done
done
rm -rf "${DATA:?}/dst/"*
{
    echo "| dataset | variant | copy s | sync s | total s | total vs journal off |"
    echo "|---|---|---|---|---|---|"
    for d in $DATASETS; do
        base=""
        for v in nojournal journal verify; do
            med() { grep "^$d,$v," "$OUT/raw.csv" | cut -d, -f"$1" | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
            c=$(med 4); s=$(med 5); t=$(med 6)
            [[ -z $base ]] && base=$t
            ratio=$(awk -v t="$t" -v b="$base" 'BEGIN { printf "%.2f", t / b }')
            echo "| $d | $v | $c | $s | $t | ${ratio}x |"
        done
    done
} >"$OUT/summary.md"
cat "$OUT/summary.md"
