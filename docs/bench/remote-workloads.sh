#!/usr/bin/env bash
# Seed 000's workloads A-D read on loopback: `dmover bench remote` through the API,
# through a dmover mount, through sshfs (if SSHFS_DIR is a sshfs mount of the same
# directory) and on the server's own disk, and `dmover cp` of the same amount of data.
# Each workload reads every file once, sequentially, in 128 KiB blocks
# (--pattern sequential --ops FILE_SIZE/128K): the streaming read of seed 000.
#
#   DMOVER=target/release/dmover SSHFS_DIR=/mnt/sshfs-of-root-data bash docs/bench/remote-workloads.sh
#
# It makes ROOT (default: a new temporary directory), serves it on 127.0.0.1:$PORT,
# prints one CSV line per run and removes what it made.
set -euo pipefail
DMOVER=${DMOVER:-dmover}
PORT=${PORT:-17790}
ROOT=${ROOT:-$(mktemp -d /tmp/dmover-remote-bench.XXXXXX)}
BLOCK=$((128 << 10))
mkdir -p "$ROOT/data"
export DMOVER_KNOWN_HOSTS=$ROOT/known_hosts
"$DMOVER" serve --root "$ROOT" --listen 127.0.0.1:$PORT --state-dir "$ROOT/state" \
    2>"$ROOT/serve.log" &
SERVER=$!
trap 'kill $SERVER; rm -rf "$ROOT"' EXIT
sleep 1
URL=dmover://127.0.0.1:$PORT/data

echo "workload,via,files,file_size,ops,seconds,mib_per_s,p50_us,p90_us,p99_us,p999_us,max_us"
# Workload, files, file size: about 64-256 MiB read per run.
for spec in "A 1 64M" "B 10 8M" "C 100 1M" "D 1000 256K"; do
    set -- $spec
    w=$1 n=$2 size=$3
    bytes=$(numfmt --from=iec "$size")
    ops=$((bytes / BLOCK))
    vias="api mount dir-local"
    [ -n "${SSHFS_DIR:-}" ] && vias="$vias dir-sshfs"
    for via in $vias; do
        extra=(--via "$via")
        case $via in
            dir-local) extra=(--via dir --dir "$ROOT/data") ;;
            dir-sshfs) extra=(--via dir --dir "$SSHFS_DIR") ;;
        esac
        "$DMOVER" bench remote "$URL" --workload "$w" "${extra[@]}" --file-size "$size" \
            --block 128K --pattern sequential --ops "$ops" --seconds 120 --json 2>/dev/null |
            python3 -c '
import json, sys
via = sys.argv[1]
for r in json.load(sys.stdin)["rows"]:
    print(",".join(str(x) for x in [r["workload"], via, r["files"], r["file_size"], r["ops"],
        r["seconds"], r["mib_per_s"], r["p50_us"], r["p90_us"], r["p99_us"], r["p999_us"],
        r["max_us"]]))' "$via"
    done
    # dmover cp of the same data (n files of size), pulled to local disk.
    mkdir -p "$ROOT/data/cp-$w"
    for i in $(seq 1 "$n"); do head -c "$bytes" /dev/urandom >"$ROOT/data/cp-$w/f$i"; done
    rm -rf "$ROOT/pulled"
    mkdir -p "$ROOT/pulled"
    t0=$(date +%s.%N)
    "$DMOVER" cp --quiet "$URL/cp-$w" "$ROOT/pulled/" 2>/dev/null
    t1=$(date +%s.%N)
    python3 -c "
s = $t1 - $t0
print('$w,cp,$n,$bytes,,%.3f,%.4g,,,,,' % (s, $n * $bytes / 2**20 / s))"
    rm -rf "$ROOT/data/cp-$w" "$ROOT/pulled"
done
