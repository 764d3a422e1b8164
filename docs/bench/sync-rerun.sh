#!/usr/bin/env bash
# Re-run of an unchanged tree: `dmover sync` against `rsync -a` to an rsync daemon
# (issue 15). The tree is the `tiny` profile (20000 files of 8 KiB in 100 directories) on
# this host's disk. Each lab: both mirrors are made once, then ROUNDS rounds of, for
# warm and cold cache (cold: `sync` and drop_caches before each run, both ends on this
# host; warm: one untimed run of the same tool first), dmover then rsync, interleaved,
# each a push of the unchanged tree.
# Labs: "loopback" (servers on 127.0.0.1) and netlab RTT:RATE links (client in netns a,
# both servers in netns b).
# Prints CSV: lab,cache,tool,round,seconds,bytes_sent (dmover's file bytes; rsync's
# "Total bytes sent" on the wire, protocol included)
# Usage: docs/bench/sync-rerun.sh [DMOVER_BINARY]   (as root; env ROUNDS, LABS, SCALE)
# With OTHER=ANOTHER_DMOVER_BINARY a third tool, "other" (that binary as client and
# server, its own mirror), runs interleaved with the two: an A/B of two builds.
# EXTRA="-c": flags given to every tool's timed runs (both take -c for --checksum).
set -euo pipefail
B=${1:-target/release/dmover}
B=$(readlink -f "$B")
OTHER=${OTHER:+$(readlink -f "$OTHER")}
TOOLS="dmover rsync${OTHER:+ other}"
EXTRA=${EXTRA:-}
ROUNDS=${ROUNDS:-5}
SCALE=${SCALE:-1}
LABS=${LABS:-"loopback 50ms:1gbit"}
W=$(mktemp -d /var/tmp/dmover-rerun.XXXXXX)
cleanup() {
    pkill -f "serve --root $W/srv" 2>/dev/null || true
    pkill -f "serve --root $W/other" 2>/dev/null || true
    pkill -f "rsync --daemon --config=$W/rsyncd.conf" 2>/dev/null || true
    "$B" netlab down --name rerun >/dev/null 2>&1 || true
    rm -rf "$W"
}
trap cleanup EXIT
mkdir -p "$W/srv" "$W/rs" "$W/home" "$W/other"
"$B" bench mkdata --profile tiny --scale "$SCALE" "$W/src" >/dev/null
head -c 32 /dev/urandom | base64 > "$W/token"
chmod 600 "$W/token"
export HOME=$W/home
cat > "$W/rsyncd.conf" <<CONF
use chroot = no
uid = root
gid = root
pid file = $W/rsyncd.pid
[w]
path = $W/rs
read only = false
CONF
echo "lab,cache,tool,round,seconds,bytes_sent"
for lab in $LABS; do
    ns_a=() ; ns_b=()
    host=127.0.0.1
    "$B" netlab down --name rerun >/dev/null 2>&1 || true
    if [ "$lab" != loopback ]; then
        IFS=: read -r rtt rate <<<"$lab"
        "$B" netlab up --name rerun --rtt "$rtt" --rate "$rate" >/dev/null
        ns_a=(ip netns exec dmnl-rerun-a)
        ns_b=(ip netns exec dmnl-rerun-b)
        host=10.200.0.2
    fi
    rm -rf "${W:?}/srv/mirror" "${W:?}/rs/mirror" "${W:?}/other/mirror" "$W/kh" "$W/kh2"
    "${ns_b[@]}" "$B" serve --root "$W/srv" --listen "$host:7700" --token-file "$W/token" \
        >"$W/serve.log" 2>&1 &
    if [ -n "$OTHER" ]; then
        "${ns_b[@]}" "$OTHER" serve --root "$W/other" --listen "$host:7701" \
            --token-file "$W/token" >"$W/serve-other.log" 2>&1 &
    fi
    "${ns_b[@]}" rsync --daemon --config="$W/rsyncd.conf" --address="$host" --port=8873
    sleep 1
    # shellcheck disable=SC2086 # EXTRA: words
    dm() { "${ns_a[@]}" "$B" sync --token-file "$W/token" --known-hosts "$W/kh" --json \
        $EXTRA "$W/src" "dmover://$host/mirror"; }
    # shellcheck disable=SC2086
    rs() { "${ns_a[@]}" rsync -a --stats $EXTRA "$W/src/" "rsync://$host:8873/w/mirror/"; }
    # shellcheck disable=SC2086
    ot() { "${ns_a[@]}" "$OTHER" sync --token-file "$W/token" --known-hosts "$W/kh2" \
        --json $EXTRA "$W/src" "dmover://$host:7701/mirror"; }
    dm >/dev/null
    rs >/dev/null
    if [ -n "$OTHER" ]; then ot >/dev/null; fi
    for round in $(seq 1 "$ROUNDS"); do
        for cache in warm cold; do
            for tool in $TOOLS; do
                if [ "$cache" = cold ]; then
                    sync; echo 3 > /proc/sys/vm/drop_caches
                elif [ $tool = dmover ]; then
                    dm >/dev/null   # warm: this tool's trees are in the cache
                elif [ $tool = other ]; then
                    ot >/dev/null
                else
                    rs >/dev/null
                fi
                t0=$(date +%s.%N)
                case $tool in
                    dmover) out=$(dm) ;;
                    other) out=$(ot) ;;
                    *) out=$(rs) ;;
                esac
                t1=$(date +%s.%N)
                if [ $tool != rsync ]; then
                    sent=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["bytes_sent"])' "$out")
                else
                    sent=$(awk -F': ' '/^Total bytes sent/ {gsub(",","",$2); print $2}' <<<"$out")
                fi
                echo "$lab,$cache,$tool,$round,$(python3 -c "print(f'{$t1-$t0:.3f}')"),$sent"
            done
        done
    done
    pkill -f "serve --root $W/srv" || true
    pkill -f "rsync --daemon --config=$W/rsyncd.conf" || true
    pkill -f "serve --root $W/other" || true
    sleep 0.5
done
