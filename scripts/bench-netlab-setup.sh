#!/usr/bin/env bash
# The fixed cost of a dmover session over emulated long links: a 1-byte push, two dmover
# builds side by side (e.g. before/after a protocol change), each with its own server in
# host b of one `dmover netlab` lab per RTT, interleaved, REPS runs each of -P 1 and -P 4
# after one unrecorded warm-up (which pins the key). Wall time of `dmover cp`, one CSV
# row per run.
#
# Usage (root):
#   scripts/bench-netlab-setup.sh A_BINARY B_BINARY "0 50 100 200" REPS OUT.csv
# Run it under the bench lock on a shared machine: flock /work/bench.lock scripts/...
set -euo pipefail
[ $# = 5 ] || { sed -n '2,9p' "$0"; exit 2; }
A=$1; B=$2; RTTS=$3; REPS=$4; OUT=$5
LAB=bs$$; W=$(mktemp -d /tmp/dmover-bench-setup.XXXXXX)
mkdir -p "$W/src" "$W/dstA" "$W/dstB"; printf x >"$W/src/tiny"; printf 'setup-%s' $$ >"$W/token"
cleanup() { "$B" netlab down --name $LAB >/dev/null 2>&1 || true; rm -rf "$W"; }
trap cleanup EXIT
[ -s "$OUT" ] || echo "when,binary,streams,rtt_ms,rep,seconds" >"$OUT"
push() { # which dest
    local bin=$A port=7792
    [ "$1" = b ] && bin=$B port=7793
    DMOVER_KNOWN_HOSTS="$W/kh-$1" "$B" netlab exec --name $LAB a -- "$bin" cp -q -P "$3" \
        --token-file "$W/token" "$W/src" "dmover://10.200.0.2:$port/$2" >/dev/null 2>&1
}
for rtt in $RTTS; do
    "$B" netlab up --name $LAB --rtt "${rtt}ms" --rate 1gbit --congestion bbr >/dev/null
    for x in a b; do
        bin=$A port=7792; [ $x = b ] && bin=$B port=7793
        "$B" netlab exec --name $LAB b -- "$bin" serve --listen 10.200.0.2:$port \
            --root "$W/dst${x^^}" --state-dir "$W/st$x" --token-file "$W/token" >/dev/null 2>&1 &
    done
    sleep 1
    push a warm 1; push b warm 1
    for rep in $(seq 1 "$REPS"); do
        for p in 1 4; do
            for x in a b; do
                rm -rf "$W/dst${x^^}/run"
                t0=$(date +%s.%N)
                push $x run $p
                t1=$(date +%s.%N)
                test -f "$W/dst${x^^}/run/tiny"
                name=$A; [ $x = b ] && name=$B
                echo "$(date -Is),$name,$p,$rtt,$rep,$(python3 -c "print(f'{$t1-$t0:.3f}')")" | tee -a "$OUT"
            done
        done
    done
    "$B" netlab down --name $LAB >/dev/null
    wait 2>/dev/null || true
done
