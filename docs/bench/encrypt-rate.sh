#!/usr/bin/env bash
# Issue 44: `dmover cp --encrypt` against the default (authenticated) data streams end
# to end, where the CPU is the limit: 2 x 1 GiB source files in the page cache, the
# destination on a tmpfs this script mounts (and unmounts), a `dmover serve` on loopback,
# the modes interleaved round by round (order alternating), medians. `--plain-data` runs
# too, for context. Every copy is compared with its source (untimed).
#
#   sudo docs/bench/encrypt-rate.sh            (root: it mounts a tmpfs)
#
# Environment: RUNS rounds (7), DMOVER binary (target/release/dmover), STREAMS (-P; empty:
# dmover's default), W work directory (default: a new one under /tmp, removed at the end;
# a given one keeps its dataset), MODES (auth encrypt plain). Prints one CSV row per run
# on stderr and the medians on stdout: Gbit/s over wall-clock time, and the CPU seconds
# client and server spent (user + system; what a shared, noisy machine cannot inflate
# as it inflates wall time).
set -euo pipefail
cd "$(dirname "$0")/../.."

RUNS=${RUNS:-7}
DMOVER=${DMOVER:-$PWD/target/release/dmover}
STREAMS=${STREAMS:-}
MODES=${MODES:-auth encrypt plain}
log() { echo "encrypt-rate: $*" >&2; }
[[ -x $DMOVER ]] || { log "no $DMOVER: cargo build --release -p dmover"; exit 1; }
[[ $(id -u) == 0 ]] || { log "needs root (mounts a tmpfs)"; exit 1; }

if [[ -n ${W:-} ]]; then KEEP=1; else W=$(mktemp -d /tmp/dmover-encrypt-rate.XXXXXX); KEEP=0; fi
DST=$W/dst
SERVER=
cleanup() {
    [[ -n $SERVER ]] && kill "$SERVER" 2>/dev/null && wait "$SERVER" 2>/dev/null
    mountpoint -q "$DST" && umount "$DST"
    if [[ $KEEP == 0 ]]; then rm -rf "${W:?}"; fi
}
trap cleanup EXIT

mkdir -p "$W/src" "$DST" "$W/state"
if [[ ! -f $W/src/.large-0.25.ok ]]; then
    rm -rf "$W/src/large"
    "$DMOVER" bench mkdata "$W/src/large" --profile large --scale 0.25 >&2
    touch "$W/src/.large-0.25.ok"
fi
SRC=$W/src/large
BYTES=$(find "$SRC" -type f -printf "%s\n" | awk "{ s += \$1 } END { printf \"%.0f\", s }")
mount -t tmpfs -o size=$((BYTES / 1048576 + 512))m dmover-encrypt-rate "$DST"

"$DMOVER" serve --root "$DST" --listen 127.0.0.1:0 --state-dir "$W/state" \
    >"$W/serve.out" 2>"$W/serve.log" &
SERVER=$!
for _ in $(seq 100); do grep -q "listening on" "$W/serve.out" 2>/dev/null && break; sleep 0.1; done
ADDR=$(sed -n 's/^dmover: listening on //p' "$W/serve.out")
[[ -n $ADDR ]] || { log "the server did not start: $(cat "$W/serve.log")"; exit 1; }
export DMOVER_KNOWN_HOSTS=$W/known_hosts

P=()
[[ -n $STREAMS ]] && P=(-P "$STREAMS")
echo "# $(date -u +%FT%TZ) $(nproc) cores, $(uname -r); $("$DMOVER" --version); $BYTES bytes in $(find "$SRC" -type f | wc -l) files; streams: ${STREAMS:-default}" >&2
echo "mode,run,seconds,gbit_per_s,client_cpu_s,server_cpu_s" >"$W/runs.csv"
# utime + stime of the server so far, in seconds.
server_cpu() { awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$SERVER/stat"; }

one() {
    local mode=$1 run=$2 t0 t1 s0 s1 flag=()
    rm -rf "${DST:?}/large"
    find "$SRC" -type f -exec cat {} + >/dev/null # the source stays in the page cache
    case $mode in
        auth) ;;
        encrypt) flag=(--encrypt) ;;
        plain) flag=(--plain-data) ;;
    esac
    s0=$(server_cpu)
    t0=$(date +%s.%N)
    /usr/bin/time -f "%U %S" -o "$W/client.time" \
        "$DMOVER" cp --quiet "${P[@]}" "${flag[@]}" "$SRC" "dmover://$ADDR/large"
    t1=$(date +%s.%N)
    s1=$(server_cpu)
    diff -rq "$SRC" "$DST/large" >/dev/null || { log "$mode run $run: the copy differs"; exit 1; }
    awk -v m="$mode" -v r="$run" -v b="$BYTES" -v t0="$t0" -v t1="$t1" -v s0="$s0" -v s1="$s1" \
        '{ s = t1 - t0; printf "%s,%d,%.3f,%.3f,%.2f,%.2f\n", m, r, s, b * 8 / s / 1e9, $1 + $2, s1 - s0 }' \
        "$W/client.time" >>"$W/runs.csv"
    tail -n 1 "$W/runs.csv" >&2
}

read -ra M <<<"$MODES"
for run in $(seq "$RUNS"); do
    if ((run % 2)); then order=("${M[@]}"); else order=(); for ((i = ${#M[@]} - 1; i >= 0; i--)); do order+=("${M[i]}"); done; fi
    for mode in "${order[@]}"; do one "$mode" "$run"; done
done
rm -rf "${DST:?}/large"

awk -F, '
    NR == 1 { next }
    function median(s,    a, m, x, y, t) {
        m = split(substr(s, 2), a, " ")
        for (x = 1; x <= m; x++) for (y = x + 1; y <= m; y++) if (a[y] + 0 < a[x] + 0) { t = a[x]; a[x] = a[y]; a[y] = t }
        return (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
    }
    { v[$1] = v[$1] " " $4; c[$1] = c[$1] " " $5; sv[$1] = sv[$1] " " $6
      if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 } }
    END {
        print "| mode | runs (Gbit/s) | median Gbit/s | client CPU s | server CPU s |"
        print "|---|---|---|---|---|"
        for (i = 1; i <= n; i++) {
            k = order[i]; M[k] = median(v[k]); C[k] = median(c[k]); S[k] = median(sv[k])
            printf "| %s | %s | %.2f | %.2f | %.2f |\n", k, substr(v[k], 2), M[k], C[k], S[k]
        }
        if (M["auth"] > 0 && M["encrypt"] > 0)
            printf "\nencrypt / auth = %.3f (goal >= 0.9); CPU seconds (client + server) encrypt / auth = %.3f\n",
                M["encrypt"] / M["auth"], (C["encrypt"] + S["encrypt"]) / (C["auth"] + S["auth"])
        if (M["plain"] > 0 && M["auth"] > 0)
            printf "auth / plain = %.3f\n", M["auth"] / M["plain"]
    }' "$W/runs.csv"
