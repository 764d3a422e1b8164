#!/usr/bin/env bash
# What protecting the data streams costs: dmover pushes with plain, authenticated (the
# default) and encrypted data streams, and scp over ssh, on the same data on loopback,
# interleaved round by round, cold page cache and `sync` counted in every run.
#
#   scripts/bench-encrypt.sh [DATASET...]        (default: medium large)
#
# Environment: B work directory (default /work/bench-security; holds data, servers,
# results), DST destination root (default $B/dst; e.g. a tmpfs to take the disk out),
# COLD=0 to keep the page cache between runs (CPU-bound runs), RUNS rounds (3), SCALE dataset scale (0.25), DMOVER binary
# (target/release/dmover), STREAMS (4), SSH_PORT (2224). Writes $B/results.csv (one row a run) and
# $B/summary.md (medians). Run it under `flock /work/bench.lock` on a shared machine.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/throwaway-ssh.sh
source scripts/lib/throwaway-ssh.sh

B=${B:-/work/bench-security}
RUNS=${RUNS:-3}
SCALE=${SCALE:-0.25}
STREAMS=${STREAMS:-4}
SSH_PORT=${SSH_PORT:-2224}
DMOVER=${DMOVER:-$PWD/target/release/dmover}
DATASETS=${*:-medium large}
DST=${DST:-$B/dst}
COLD=${COLD:-1}
TOOLS="dmover-plain dmover-auth dmover-encrypt scp"

log() { echo "bench-encrypt: $*" >&2; }
mkdir -p "$B/src" "$DST" "$B/state" "$B/ssh"
[[ -x $DMOVER ]] || { log "no $DMOVER: cargo build --release -p dmover"; exit 1; }
command -v sshd >/dev/null || PATH=$PATH:/usr/sbin
command -v sshd >/dev/null || { log "needs openssh-server (apt-get install openssh-server)"; exit 1; }

cleanup() {
    [[ -f $B/dmover.pid ]] && kill "$(cat "$B/dmover.pid")" 2>/dev/null || true
    [[ -f $B/ssh/sshd.pid ]] && kill "$(cat "$B/ssh/sshd.pid")" 2>/dev/null || true
    rm -f "$B/dmover.pid"
}
trap cleanup EXIT

for ds in $DATASETS; do
    if [[ ! -f $B/src/.$ds-$SCALE.ok ]]; then
        rm -rf "${B:?}/src/$ds"
        "$DMOVER" bench mkdata "$B/src/$ds" --profile "$ds" --scale "$SCALE" >&2
        touch "$B/src/.$ds-$SCALE.ok"
    fi
done

# sshd on 127.0.0.1:$SSH_PORT with throwaway keys (see /work/shared/docs/peers.md).
S=$B/ssh
throwaway_ssh "$S" 127.0.0.1 "$SSH_PORT"
"$(command -v sshd)" -f "$S/sshd_config"
for _ in $(seq 50); do ssh -F "$S/ssh_config" bench true 2>/dev/null && break; sleep 0.2; done
ssh -F "$S/ssh_config" bench true

"$DMOVER" serve --root "$DST" --listen 127.0.0.1:0 --state-dir "$B/state" \
    >"$B/serve.out" 2>"$B/serve.log" &
echo $! >"$B/dmover.pid"
for _ in $(seq 50); do grep -q "listening on" "$B/serve.out" 2>/dev/null && break; sleep 0.1; done
ADDR=$(sed -n 's/^dmover: listening on //p' "$B/serve.out")
export DMOVER_KNOWN_HOSTS=$B/known_hosts
rm -f "$DMOVER_KNOWN_HOSTS"

{
    echo "# cold page cache: $COLD, destination: $DST ($(df --output=fstype "$DST" | tail -n 1))"
    echo "# $(date -u +%FT%TZ) $(nproc) cores, $(uname -r); $("$DMOVER" --version); $(ssh -V 2>&1)"
    echo "# cipher used by scp: $(ssh -F "$S/ssh_config" -G bench | sed -n 's/^ciphers //p' | cut -d, -f1)"
    echo "dataset,tool,run,bytes,seconds,gbit_per_s"
} >"$B/results.csv"

one() {
    local ds=$1 tool=$2 run=$3 t0 t1 bytes
    rm -rf "${DST:?}/$ds"
    sync
    if [[ $COLD == 1 ]]; then echo 3 >/proc/sys/vm/drop_caches; fi
    t0=$(date +%s.%N)
    case $tool in
        dmover-plain) "$DMOVER" cp --quiet -P "$STREAMS" --plain-data "$B/src/$ds" "dmover://$ADDR/$ds" ;;
        dmover-auth) "$DMOVER" cp --quiet -P "$STREAMS" "$B/src/$ds" "dmover://$ADDR/$ds" ;;
        dmover-encrypt) "$DMOVER" cp --quiet -P "$STREAMS" --encrypt "$B/src/$ds" "dmover://$ADDR/$ds" ;;
        scp) scp -q -r -F "$S/ssh_config" "$B/src/$ds" "bench:$DST/$ds" ;;
    esac
    sync
    t1=$(date +%s.%N)
    bytes=$(du -sb --apparent-size "$B/src/$ds" | cut -f1)
    if ! diff -rq "$B/src/$ds" "$DST/$ds" >/dev/null; then
        log "$tool $ds run $run: copy differs from the source"
        exit 1
    fi
    awk -v ds="$ds" -v tool="$tool" -v run="$run" -v b="$bytes" -v t0="$t0" -v t1="$t1" \
        'BEGIN { s = t1 - t0; printf "%s,%s,%d,%.0f,%.3f,%.3f\n", ds, tool, run, b, s, b * 8 / s / 1e9 }' \
        >>"$B/results.csv"
    tail -n 1 "$B/results.csv" >&2
}

for run in $(seq "$RUNS"); do
    for ds in $DATASETS; do
        for tool in $TOOLS; do one "$ds" "$tool" "$run"; done
    done
done
rm -rf "${DST:?}/"*

awk -F, '
    /^#/ || $1 == "dataset" { next }
    { key = $1 "," $2; v[key] = v[key] " " $6; if (!(key in seen)) { seen[key] = 1; order[++n] = key } }
    END {
        print "| dataset | tool | runs (Gbit/s) | median Gbit/s |"
        print "|---|---|---|---|"
        for (i = 1; i <= n; i++) {
            k = order[i]; m = split(substr(v[k], 2), a, " ")
            for (x = 1; x <= m; x++) for (y = x + 1; y <= m; y++) if (a[y] < a[x]) { t = a[x]; a[x] = a[y]; a[y] = t }
            med = (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
            split(k, kk, ","); printf "| %s | %s | %s | %.2f |\n", kk[1], kk[2], substr(v[k], 2), med
            M[k] = med
        }
        print ""
        for (i = 1; i <= n; i++) {
            split(order[i], kk, ","); ds = kk[1]
            if (done[ds]++) continue
            printf "%s: encrypted / plain = %.2f, encrypted / authenticated = %.2f, authenticated / plain = %.2f, encrypted / scp = %.1f\n", ds,
                M[ds ",dmover-encrypt"] / M[ds ",dmover-plain"], M[ds ",dmover-encrypt"] / M[ds ",dmover-auth"],
                M[ds ",dmover-auth"] / M[ds ",dmover-plain"], M[ds ",dmover-encrypt"] / M[ds ",scp"]
        }
    }' "$B/results.csv" | tee "$B/summary.md"
