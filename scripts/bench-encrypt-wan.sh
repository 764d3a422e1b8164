#!/usr/bin/env bash
# scripts/bench-encrypt.sh over emulated long-haul links: dmover pushes with plain,
# authenticated (default) and encrypted data streams, and scp over ssh, on the same data,
# across a `dmover netlab` link (two network namespaces, the userspace forwarder adding
# half the RTT each way and holding the link rate). `dmover serve` and sshd run in host b,
# the clients in host a. Data on tmpfs at both ends (/dev/shm), so neither disk is the
# limit; every copy is checked with `diff -r`; tools interleaved in every round.
#
#   scripts/bench-encrypt-wan.sh              (root; openssh-server, python3 installed)
#
# Environment: RTTS ("0 10 50 100", ms), RATE (5gbit), CC (cubic), RUNS (3), DATASET
# (medium), SCALE (0.5: 16 x 128 MiB = 2 GiB), STREAMS (4), LOCK (a file: each RTT's
# runs hold `flock LOCK`, e.g. /work/bench.lock), OUT (CSV, default
# docs/bench/encrypt-wan-DATE.csv; rows are appended), TOOLS ("dmover-plain dmover-auth
# dmover-encrypt scp"), DMOVER (target/release/dmover). One CSV row a run, with the
# forwarder's CPU (cores) and release lateness over that run, so an emulator limit shows;
# medians and ratios are printed at the end (scripts/bench-encrypt-wan.sh summary CSV
# prints them again).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/throwaway-ssh.sh
source scripts/lib/throwaway-ssh.sh

summary() { # CSV: medians per rtt x tool, and encrypted / scp etc. per rtt
    python3 - "$1" <<'EOF'
import csv, statistics, sys
from collections import defaultdict
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if not l.startswith("#"))]
v, cpu, late = defaultdict(list), defaultdict(list), defaultdict(list)
for r in rows:
    k = (r["rate"], r["cc"], int(r["rtt_ms"]), r["tool"])
    v[k].append(float(r["gbit_per_s"])); cpu[k].append(float(r["fwd_cpu_cores"]))
    late[k].append(float(r["fwd_late_p99_us"]))
tools = ["dmover-plain", "dmover-auth", "dmover-encrypt", "scp"]
print("| link | RTT ms | " + " | ".join(tools) + " | encrypted / scp | encrypted / plain | forwarder CPU (cores), p99 lateness us |")
print("|---" * (len(tools) + 5) + "|")
for link in sorted({(k[0], k[1], k[2]) for k in v}, key=lambda x: (x[0], x[1], x[2])):
    m = {t: statistics.median(v[link + (t,)]) for t in tools if v.get(link + (t,))}
    cells = [f"{m[t]:.2f} ({' '.join(f'{x:.2f}' for x in v[link + (t,)])})" if t in m else "-" for t in tools]
    ratio = lambda a, b: f"{m[a] / m[b]:.1f}" if a in m and b in m and m[b] else "-"
    allk = [link + (t,) for t in tools if link + (t,) in cpu]
    c = statistics.median([x for k in allk for x in cpu[k]])
    p = statistics.median([x for k in allk for x in late[k]])
    print(f"| {link[0]} {link[1]} | {link[2]} | " + " | ".join(cells) + f" | {ratio('dmover-encrypt', 'scp')} | {ratio('dmover-encrypt', 'dmover-plain')} | {c:.2f}, {p:.0f} |")
EOF
}
if [[ ${1:-} == summary ]]; then summary "$2"; exit 0; fi

RTTS=${RTTS:-0 10 50 100}
RATE=${RATE:-5gbit}
CC=${CC:-cubic}
RUNS=${RUNS:-3}
DATASET=${DATASET:-medium}
SCALE=${SCALE:-0.5}
STREAMS=${STREAMS:-4}
LOCK=${LOCK:-}
TOOLS=${TOOLS:-dmover-plain dmover-auth dmover-encrypt scp}
DMOVER=${DMOVER:-$PWD/target/release/dmover}
OUT=${OUT:-docs/bench/encrypt-wan-$(date -u +%F).csv}
log() { echo "bench-encrypt-wan: $*" >&2; }
[[ $(id -u) == 0 ]] || { log "needs root (network namespaces)"; exit 1; }
[[ -x $DMOVER ]] || { log "no $DMOVER: cargo build --release -p dmover"; exit 1; }
SSHD=$(command -v sshd || echo /usr/sbin/sshd)
[[ -x $SSHD ]] || { log "needs openssh-server (apt-get install openssh-server)"; exit 1; }
command -v python3 >/dev/null || { log "needs python3"; exit 1; }

W=/dev/shm/dmover-bench-wan-$$
LAB=bew$$
SSH_PORT=2225
DM_PORT=7725
ADDR_B=10.200.0.2
mkdir -p "$W/src" "$W/dst" "$W/ssh" "$W/state"
mkdir -p "$(dirname "$OUT")"

stop_group() { # pid file: kill the process group it leads
    local f=$1 pid
    [[ -s $f ]] || return 0
    pid=$(cat "$f")
    kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
    rm -f "$f"
}
cleanup() {
    stop_group "$W/dmover.pgid"
    stop_group "$W/sshd.pgid"
    "$DMOVER" netlab down --name "$LAB" >/dev/null 2>&1 || true
    rm -rf "$W"
}
trap cleanup EXIT

"$DMOVER" bench mkdata "$W/src/$DATASET" --profile "$DATASET" --scale "$SCALE" >&2
BYTES=$(du -sb --apparent-size "$W/src/$DATASET" | cut -f1)
printf 'bench-wan-%s-%s' "$$" "$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')" >"$W/token"
chmod 600 "$W/token"

# Throwaway ssh keys and an sshd of our own (see /work/shared/docs/peers.md).
S=$W/ssh
throwaway_ssh "$S" "$ADDR_B" "$SSH_PORT"

if [[ ! -s $OUT ]]; then
    {
        echo "# $(nproc) cores, $(uname -r); $("$DMOVER" --version); $(ssh -V 2>&1); data on tmpfs; dmover -P $STREAMS; scp -r (SFTP protocol), cipher $(ssh -F "$S/ssh_config" -G bench | sed -n 's/^ciphers //p' | cut -d, -f1)"
        echo "when,rate,cc,rtt_ms,dataset,tool,run,bytes,seconds,gbit_per_s,fwd_cpu_cores,fwd_late_mean_us,fwd_late_p99_us,fwd_queue_drops"
    } >"$OUT"
fi

fwd_stats() { # "cpu_seconds elapsed late_mean p99 queue_drops" of the a->b direction (+ b->a CPU)
    "$DMOVER" netlab stats --name "$LAB" --json | python3 -c '
import json, sys
s = json.load(sys.stdin)
a, b = s["a_to_b"], s["b_to_a"]
print(a["cpu_seconds"] + b["cpu_seconds"], s["elapsed_seconds"], a["late_mean_us"], a["late_p99_us"], a["queue_drops"])'
}

one() { # rtt tool run
    local rtt=$1 tool=$2 run=$3 t0 t1 before after fwd
    local ex_a=("$DMOVER" netlab exec --name "$LAB" a --)
    rm -rf "${W:?}/dst/$DATASET"
    # The statistics file is rewritten every second: let it catch up between runs.
    sleep 1.2
    before=$(fwd_stats)
    t0=$(date +%s.%N)
    case $tool in
        dmover-plain) "${ex_a[@]}" "$DMOVER" cp --quiet -P "$STREAMS" --plain-data --token-file "$W/token" "$W/src/$DATASET" "dmover://$ADDR_B:$DM_PORT/$DATASET" ;;
        dmover-auth) "${ex_a[@]}" "$DMOVER" cp --quiet -P "$STREAMS" --token-file "$W/token" "$W/src/$DATASET" "dmover://$ADDR_B:$DM_PORT/$DATASET" ;;
        dmover-encrypt) "${ex_a[@]}" "$DMOVER" cp --quiet -P "$STREAMS" --encrypt --token-file "$W/token" "$W/src/$DATASET" "dmover://$ADDR_B:$DM_PORT/$DATASET" ;;
        scp) "${ex_a[@]}" scp -q -r -F "$S/ssh_config" "$W/src/$DATASET" "bench:$W/dst/$DATASET" ;;
        *) log "unknown tool $tool"; exit 2 ;;
    esac
    t1=$(date +%s.%N)
    sleep 1.2
    after=$(fwd_stats)
    if ! diff -rq "$W/src/$DATASET" "$W/dst/$DATASET" >/dev/null; then
        log "$tool rtt $rtt run $run: the copy differs from the source"
        exit 1
    fi
    fwd=$(python3 -c "
b='$before'.split(); a='$after'.split()
cpu=(float(a[0])-float(b[0]))/max(1e-9, float(a[1])-float(b[1]))
print(f'{cpu:.3f},{float(a[2]):.1f},{float(a[3]):.0f},{int(a[4])-int(b[4])}')")
    awk -v when="$(date -u +%FT%TZ)" -v rate="$RATE" -v cc="$CC" -v rtt="$rtt" -v ds="$DATASET" \
        -v tool="$tool" -v run="$run" -v b="$BYTES" -v t0="$t0" -v t1="$t1" -v fwd="$fwd" \
        'BEGIN { s = t1 - t0; printf "%s,%s,%s,%s,%s,%s,%d,%.0f,%.3f,%.3f,%s\n", when, rate, cc, rtt, ds, tool, run, b, s, b * 8 / s / 1e9, fwd }' \
        | tee -a "$OUT" >&2
}

one_rtt() { # rtt: a lab, the servers in b, RUNS interleaved rounds, everything down again
    local rtt=$1
    "$DMOVER" netlab down --name "$LAB" >/dev/null 2>&1 || true
    "$DMOVER" netlab up --name "$LAB" --rtt "${rtt}ms" --rate "$RATE" --congestion "$CC" >/dev/null
    # Each server leads its own process group (setsid), so it is stopped with its children.
    setsid "$DMOVER" netlab exec --name "$LAB" b -- "$SSHD" -D -e -f "$S/sshd_config" \
        2>"$W/sshd.log" &
    echo $! >"$W/sshd.pgid"
    setsid "$DMOVER" netlab exec --name "$LAB" b -- "$DMOVER" serve --listen "$ADDR_B:$DM_PORT" \
        --root "$W/dst" --token-file "$W/token" --state-dir "$W/state" \
        >"$W/serve.out" 2>"$W/serve.log" &
    echo $! >"$W/dmover.pgid"
    export DMOVER_KNOWN_HOSTS=$W/known_hosts
    rm -f "$DMOVER_KNOWN_HOSTS"
    local ok=""
    for _ in $(seq 100); do
        if grep -q "listening on" "$W/serve.out" 2>/dev/null &&
            "$DMOVER" netlab exec --name "$LAB" a -- ssh -F "$S/ssh_config" bench true 2>/dev/null; then
            ok=1
            break
        fi
        sleep 0.2
    done
    [[ -n $ok ]] || { log "servers in the lab did not come up; $(cat "$W/sshd.log" "$W/serve.log")"; exit 1; }
    for run in $(seq "$RUNS"); do
        for tool in $TOOLS; do one "$rtt" "$tool" "$run"; done
    done
    stop_group "$W/dmover.pgid"
    stop_group "$W/sshd.pgid"
    "$DMOVER" netlab down --name "$LAB" >&2
}

for rtt in $RTTS; do
    if [[ -n $LOCK ]]; then
        exec 9>"$LOCK"
        flock 9
        one_rtt "$rtt"
        flock -u 9
        exec 9>&-
    else
        one_rtt "$rtt"
    fi
done
rm -rf "${W:?}/dst/"*
summary "$OUT"
