#!/usr/bin/env bash
# bench-core.sh: cold-cache copy benchmark of dmover against cp, the rsync daemon and GridFTP on
# loopback, with the project's reference datasets (see crates/dmover-bench, `dmover bench mkdata`).
#
# Usage: scripts/bench-core.sh [DATASET...]        (default datasets: tiny losf medium large)
#
# For every dataset, repeat and tool: remove the destination, `sync` and drop the page cache,
# then time the copy plus a `sync` (a copy is done when its data is on disk), verify it, and
# record a row. Tools are interleaved within each repeat so drift hits them alike.
#
# Environment (all optional):
#   DATASETS      datasets (tiny losf medium large mixed demo); arguments override it
#   TOOLS         tools, default "cp rsync gridftp dmover-push"; also available:
#                 rsync-push gridftp-default dmover-pull
#   SCALE         dataset scale (1 = reference sizes; 0.05 for a quick run), default 1
#   SEED          dataset content seed, default 1
#   REPEATS       repeats per dataset and tool, default 3
#   BENCH_DATA    data directory: src/ (datasets, kept between runs), dst/ (emptied), state/
#                 (configs, pid files, logs). Default /work/benchdata, else /tmp/dmover-bench.
#                 Source and destinations share its file system.
#   OUT           results directory, default bench-out/core-YYYYmmdd-HHMMSS in the repo
#   DMOVER        dmover binary; default: build target/release/dmover with cargo
#   MKDATA        dataset generator command, default "$DMOVER bench mkdata"; it is called as
#                 MKDATA DIR --profile P --scale F --seed S (the dmover-bench example
#                 `target/release/examples/mkdata` takes the same arguments)
#   DMOVER_FLAGS  extra flags for `dmover cp`, e.g. "--direct-io"
#   GRIDFTP_FLAGS flags of the tuned `gridftp` tool (with -r -cd), default "-p 4 -cc 4 -pp -fast".
#                 With -fast, globus-url-copy 10.12 often fails recursive copies of trees
#                 with subdirectories ("Unable to list url ...: an end-of-file was reached";
#                 about 1 run in 3 on `tiny`, more with -p 4 -cc 4); "-p 4 -cc 4 -pp" avoids it.
#   DMOVER_HOST   host part of remote paths, default 127.0.0.1
#   DMOVER_LISTEN address of `dmover serve`, default 127.0.0.1:7700
#   RSYNC_PORT, GRIDFTP_PORT, IPERF_PORT   default 8873, 2811, 5201
#   VERIFY        sample (default: listing + bytes + content of sampled files) | full (diff -r)
#   CEILINGS=1    also measure iperf3 loopback (1 and 4 streams) and fio (cold reads, writes)
#   IPERF_TIME    seconds per iperf3 run, default 10;  FIO_SIZE  fio file size, default 4G
#   INSTALL=0     do not apt-get install missing peer tools
#   CLEAN_SRC=1   delete the generated datasets at the end
#   STRICT=1      exit 1 if any row failed (default: exit 0 once the run completes)
#
# Quick:  SCALE=0.05 REPEATS=1 scripts/bench-core.sh tiny losf
# Full:   CEILINGS=1 scripts/bench-core.sh
#
# Outputs in $OUT: raw.csv (dataset,tool,repeat,seconds,bytes,files,gbit_s,files_s,ok),
# summary.md (medians), machine.txt, logs/ (one log per tool run, server logs).

set -euo pipefail
shopt -s nullglob

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ALL_DATASETS="tiny losf medium large mixed demo"
ALL_TOOLS="cp rsync rsync-push gridftp gridftp-default dmover-push dmover-pull"

if [[ $# -gt 0 ]]; then DATASETS="$*"; fi
DATASETS=${DATASETS:-tiny losf medium large}
TOOLS=${TOOLS:-cp rsync gridftp dmover-push}
SCALE=${SCALE:-1}
SEED=${SEED:-1}
REPEATS=${REPEATS:-3}
VERIFY=${VERIFY:-sample}
CEILINGS=${CEILINGS:-0}
IPERF_TIME=${IPERF_TIME:-10}
FIO_SIZE=${FIO_SIZE:-4G}
INSTALL=${INSTALL:-1}
CLEAN_SRC=${CLEAN_SRC:-0}
STRICT=${STRICT:-0}
DMOVER_HOST=${DMOVER_HOST:-127.0.0.1}
DMOVER_LISTEN=${DMOVER_LISTEN:-127.0.0.1:7700}
RSYNC_PORT=${RSYNC_PORT:-8873}
GRIDFTP_PORT=${GRIDFTP_PORT:-2811}
IPERF_PORT=${IPERF_PORT:-5201}
read -r -a DMOVER_EXTRA <<<"${DMOVER_FLAGS:-}"
GRIDFTP_FLAGS=${GRIDFTP_FLAGS:--p 4 -cc 4 -pp -fast}
read -r -a GRIDFTP_EXTRA <<<"$GRIDFTP_FLAGS"
if [[ -z ${BENCH_DATA:-} ]]; then
    if [[ -d /work && -w /work ]]; then BENCH_DATA=/work/benchdata; else BENCH_DATA=/tmp/dmover-bench; fi
fi
OUT=${OUT:-$REPO/bench-out/core-$(date +%Y%m%d-%H%M%S)}
SRC_ROOT=$BENCH_DATA/src
DST_ROOT=$BENCH_DATA/dst
STATE=$BENCH_DATA/state
LOGS=$OUT/logs

log() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

# --- checks -------------------------------------------------------------------------------------

for d in $DATASETS; do
    [[ " $ALL_DATASETS " == *" $d "* ]] || die "unknown dataset '$d' (known: $ALL_DATASETS)"
done
for t in $TOOLS; do
    [[ " $ALL_TOOLS " == *" $t "* ]] || die "unknown tool '$t' (known: $ALL_TOOLS)"
done
[[ $REPEATS =~ ^[1-9][0-9]*$ ]] || die "REPEATS must be a positive integer, not '$REPEATS'"
[[ $SCALE =~ ^[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?$ ]] || die "SCALE must be a number, not '$SCALE'"
[[ $VERIFY == sample || $VERIFY == full ]] || die "VERIFY must be sample or full"
[[ $(id -u) == 0 ]] || die "run as root (drop_caches, GridFTP as root, apt-get)"

# The script deletes $BENCH_DATA/dst at exit: only ever in a directory it owns.
if [[ -d $BENCH_DATA && ! -f $BENCH_DATA/.dmover-bench ]] && [[ -n $(ls -A "$BENCH_DATA") ]]; then
    die "BENCH_DATA=$BENCH_DATA is not empty and was not made by this script"
fi
mkdir -p "$SRC_ROOT" "$DST_ROOT" "$STATE" "$LOGS"
touch "$BENCH_DATA/.dmover-bench"

# --- servers and cleanup ------------------------------------------------------------------------

# Whether process $1 exists and is not a zombie (daemons are reparented to init, which may
# be slow to reap them).
alive() {
    local st
    st=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
    [[ $st != Z* ]]
}

# Stops the process named in pid file $1 if it still runs the program $2.
stop_pidfile() {
    local pf=$1 name=$2 pid i
    [[ -f $pf ]] || return 0
    pid=$(<"$pf")
    if [[ $pid =~ ^[0-9]+$ ]] && alive "$pid" &&
        tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$name"; then
        kill "$pid" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do
            alive "$pid" || break
            sleep 0.1
        done
        if alive "$pid"; then kill -9 "$pid" 2>/dev/null || true; fi
    fi
    rm -f "$pf"
}

stop_servers() {
    stop_pidfile "$STATE/rsyncd.pid" "rsync"
    stop_pidfile "$STATE/gridftp.pid" "globus-gridftp-server"
    stop_pidfile "$STATE/dmover.pid" "serve"
    stop_pidfile "$STATE/iperf3.pid" "iperf3"
}

# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_servers
    # Destinations only ever hold copies this script made.
    rm -rf "${DST_ROOT:?}" "${BENCH_DATA:?}/fio.dat"
    if [[ $CLEAN_SRC == 1 ]]; then rm -rf "${SRC_ROOT:?}"; fi
    # Server logs are worth keeping with the results.
    if [[ -d $STATE && -d $LOGS ]]; then cp -f "$STATE"/*.log "$LOGS"/ 2>/dev/null || true; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Servers left behind by a run that was killed hard.
stop_servers

port_busy() { ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }

# Waits up to $2 seconds for a listener on port $1; gives up early if process $3 (if given)
# has exited.
wait_port() {
    local i
    for ((i = 0; i < $2 * 10; i++)); do
        port_busy "$1" && return 0
        if [[ -n ${3:-} ]] && ! alive "$3"; then return 1; fi
        sleep 0.1
    done
    return 1
}

# --- tools --------------------------------------------------------------------------------------

need_tools() {
    local missing=() t
    for t in rsync globus-gridftp-server globus-url-copy iperf3 fio jq ss; do
        command -v "$t" >/dev/null 2>&1 || missing+=("$t")
    done
    ((${#missing[@]})) || return 0
    if [[ $INSTALL != 1 ]]; then
        log "missing tools (INSTALL=0): ${missing[*]}; their rows will fail"
        return 0
    fi
    log "installing peer tools (missing: ${missing[*]})"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >"$LOGS/apt.log" 2>&1 || true
    apt-get install -y -qq rsync globus-gridftp-server-progs globus-gass-copy-progs iperf3 fio \
        hyperfine jq iproute2 >>"$LOGS/apt.log" 2>&1 || log "apt-get install failed; see $LOGS/apt.log"
}

need_dmover() {
    if [[ -n ${DMOVER:-} ]]; then
        [[ -x $DMOVER ]] || die "DMOVER=$DMOVER is not an executable"
        return 0
    fi
    log "building dmover (release)"
    (cd "$REPO" && cargo build --release -p dmover) >"$LOGS/build.log" 2>&1 ||
        die "cargo build failed; see $LOGS/build.log"
    DMOVER=${CARGO_TARGET_DIR:-$REPO/target}/release/dmover
}

need_mkdata() {
    if [[ -n ${MKDATA:-} ]]; then
        read -r -a MKDATA_CMD <<<"$MKDATA"
    else
        MKDATA_CMD=("$DMOVER" bench mkdata)
    fi
}

tool_version() { "$@" 2>&1 | head -n 1 || true; }

write_machine_info() {
    {
        echo "date: $(date -Is)"
        echo "command: $0 $*"
        echo "settings: DATASETS='$DATASETS' TOOLS='$TOOLS' SCALE=$SCALE SEED=$SEED REPEATS=$REPEATS" \
            "VERIFY=$VERIFY DMOVER_FLAGS='${DMOVER_FLAGS:-}' GRIDFTP_FLAGS='$GRIDFTP_FLAGS'" \
            "CEILINGS=$CEILINGS"
        echo "repo: $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')" \
            "$(git -C "$REPO" status --porcelain 2>/dev/null | grep -q . && echo '(dirty)')"
        echo "host: $(hostname)"
        echo "kernel: $(uname -srvm)"
        echo "nproc: $(nproc)"
        echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
        echo "memory: $(free -g | awk '/^Mem:/ {print $2 " GiB"}')"
        echo "data dir: $BENCH_DATA"
        echo "data fs: $(findmnt -no FSTYPE,SOURCE,OPTIONS --target "$BENCH_DATA" 2>/dev/null || stat -f -c %T "$BENCH_DATA")"
        echo "data free: $(df -h --output=avail "$BENCH_DATA" | tail -n 1 | tr -d ' ')"
        echo "vm.dirty_ratio/background: $(sysctl -n vm.dirty_ratio)/$(sysctl -n vm.dirty_background_ratio)"
        echo "tcp congestion control: $(sysctl -n net.ipv4.tcp_congestion_control)"
        echo "versions:"
        echo "  dmover: $(tool_version "$DMOVER" --version)"
        echo "  cp: $(tool_version cp --version)"
        echo "  rsync: $(tool_version rsync --version)"
        echo "  globus-gridftp-server: $(tool_version globus-gridftp-server -version)"
        echo "  globus-url-copy: $(tool_version globus-url-copy -version)"
        echo "  iperf3: $(tool_version iperf3 --version)"
        echo "  fio: $(tool_version fio --version)"
    } >"$OUT/machine.txt"
}

start_rsyncd() {
    port_busy "$RSYNC_PORT" && {
        log "port $RSYNC_PORT busy: rsync rows will fail"
        return 1
    }
    cat >"$STATE/rsyncd.conf" <<EOF
pid file = $STATE/rsyncd.pid
log file = $STATE/rsyncd.log
address = 127.0.0.1
port = $RSYNC_PORT
use chroot = no
uid = root
gid = root

[src]
    path = $SRC_ROOT
    read only = yes

[dst]
    path = $DST_ROOT
    read only = no
    # Without chroot the daemon would prefix received symlinks with /rsyncd-munged/.
    munge symlinks = no
EOF
    rsync --daemon --config="$STATE/rsyncd.conf" && wait_port "$RSYNC_PORT" 10
}

start_gridftp() {
    port_busy "$GRIDFTP_PORT" && {
        log "port $GRIDFTP_PORT busy: GridFTP rows will fail"
        return 1
    }
    globus-gridftp-server -S -p "$GRIDFTP_PORT" -control-interface 127.0.0.1 \
        -data-interface 127.0.0.1 -aa -anonymous-user root -allow-root -threads 2 \
        -pidfile "$STATE/gridftp.pid" -l "$STATE/gridftp.log" -log-level ERROR,WARN &&
        wait_port "$GRIDFTP_PORT" 10
}

start_dmover() {
    local port=${DMOVER_LISTEN##*:}
    port_busy "$port" && {
        log "port $port busy: dmover rows will fail"
        return 1
    }
    # No token: the server accepts loopback clients only. Its root holds src/ and dst/.
    "$DMOVER" serve --root "$BENCH_DATA" --listen "$DMOVER_LISTEN" >"$STATE/dmover.log" 2>&1 &
    echo $! >"$STATE/dmover.pid"
    wait_port "$port" 10 "$!"
}

# --- datasets -----------------------------------------------------------------------------------

# Warns when the data file system may be too small: every missing source plus the largest
# destination (one copy exists at a time).
check_space() {
    local need avail
    need=$(awk -v scale="$SCALE" -v list="$DATASETS" -v root="$SRC_ROOT" -v seed="$SEED" '
        BEGIN {
            mib["tiny"] = 160; mib["losf"] = 1024; mib["medium"] = 4096; mib["large"] = 8192
            mib["mixed"] = 762; mib["demo"] = 318
            n = split(list, d, " ")
            for (i = 1; i <= n; i++) {
                m = mib[d[i]] * scale; if (m > max) max = m
                ok = root "/." d[i] "-x" scale "-s" seed ".ok"
                if ((getline line < ok) <= 0) total += m
                close(ok)
            }
            printf "%d", (total + max) * 1.05 + 64
        }')
    avail=$(df -m --output=avail "$BENCH_DATA" | tail -n 1 | tr -d ' ')
    if ((avail < need)); then
        log "warning: $BENCH_DATA has $avail MiB free, this run may need about $need MiB"
    fi
}

# Makes dataset $1 at $SCALE/$SEED unless a complete copy exists; prints its directory name.
make_dataset() {
    local ds=$1 name dir
    name="$ds-x$SCALE-s$SEED"
    dir=$SRC_ROOT/$name
    if [[ -f $SRC_ROOT/.$name.ok && -d $dir ]]; then
        echo "$name"
        return 0
    fi
    rm -rf "${dir:?}" "$SRC_ROOT/.$name.ok"
    log "generating $name"
    if ! "${MKDATA_CMD[@]}" "$dir" --profile "$ds" --scale "$SCALE" --seed "$SEED" \
        >"$LOGS/mkdata-$name.log" 2>&1; then
        log "${MKDATA_CMD[*]} failed; see $LOGS/mkdata-$name.log"
        return 1
    fi
    if [[ ! -d $dir ]] || [[ -z $(ls -A "$dir") ]]; then
        log "${MKDATA_CMD[*]} made no files in $dir"
        return 1
    fi
    sync
    cp "$LOGS/mkdata-$name.log" "$SRC_ROOT/.$name.ok"
    echo "$name"
}

# Sorted listing of a tree: kind, size of files, path, target of symlinks (not dir sizes).
listing() {
    (cd "$1" && find . -mindepth 1 \( -type f -printf 'f %s %P\n' \) -o \
        \( -type l -printf 'l %P -> %l\n' \) -o \( -type d -printf 'd %P\n' \) -o -printf '? %P\n') |
        LC_ALL=C sort
}

# --- one timed copy -----------------------------------------------------------------------------

# Runs tool $1 copying dataset $2 (directory name under src/) into dst/$1/$2.
run_tool() {
    local tool=$1 name=$2 src=$SRC_ROOT/$2 dst=$DST_ROOT/$1/$2
    case $tool in
    cp) cp -r "$src" "$dst" ;;
    rsync) rsync -a "rsync://127.0.0.1:$RSYNC_PORT/src/$name/" "$dst/" ;;
    rsync-push) rsync -a "$src/" "rsync://127.0.0.1:$RSYNC_PORT/dst/$tool/$name/" ;;
    gridftp)
        globus-url-copy -r -cd "${GRIDFTP_EXTRA[@]}" \
            "ftp://127.0.0.1:$GRIDFTP_PORT$src/" "file://$dst/"
        ;;
    gridftp-default) globus-url-copy -r -cd "ftp://127.0.0.1:$GRIDFTP_PORT$src/" "file://$dst/" ;;
    dmover-push) "$DMOVER" cp --json "${DMOVER_EXTRA[@]}" "$src" "$DMOVER_HOST:dst/$tool/$name" ;;
    dmover-pull) "$DMOVER" cp --json "${DMOVER_EXTRA[@]}" "$DMOVER_HOST:src/$name" "$dst" ;;
    esac
}

# Compares copy $2 with source $1 (listing file $3). Prints the first difference.
verify_copy() {
    local src=$1 dst=$2 list=$3 n i f size off step
    local -a sample
    [[ -d $dst ]] || {
        echo "verify: $dst missing"
        return 1
    }
    if ! listing "$dst" | cmp -s - "$list"; then
        # "<" lines are in the source only, ">" lines in the copy only.
        echo "verify: listing differs: $(listing "$dst" | diff "$list" - | grep -m 1 '^[<>]')"
        listing "$dst" | diff "$list" - | head -n 20
        return 1
    fi
    if [[ $VERIFY == full ]]; then
        if ! diff -r --no-dereference "$src" "$dst" >"$STATE/diff.out" 2>&1; then
            echo "verify: content differs: $(head -n 1 "$STATE/diff.out")"
            head -n 20 "$STATE/diff.out"
            return 1
        fi
        return 0
    fi
    # Sample: up to 16 files spread over the listing; small ones whole, big ones at
    # 3 slices of 4 MiB (start, middle, end).
    mapfile -t sample < <(awk '$1 == "f" && $2 > 0 {print substr($0, 3)}' "$list")
    n=${#sample[@]}
    ((n)) || return 0
    step=$(((n + 15) / 16))
    for ((i = 0; i < n; i += step)); do
        size=${sample[i]%% *}
        f=${sample[i]#* }
        if ((size <= 64 * 1048576)); then
            cmp -s "$src/$f" "$dst/$f" || {
                echo "verify: $f differs"
                return 1
            }
        else
            for off in 0 $(((size / 2) & ~4095)) $((size - 4194304)); do
                cmp -s -i "$off" -n 4194304 "$src/$f" "$dst/$f" || {
                    echo "verify: $f differs within 4 MiB at $off"
                    return 1
                }
            done
        fi
    done
}

drop_caches() {
    sync
    echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || {
        [[ -n ${WARNED_CACHE:-} ]] || log "warning: cannot drop caches: runs are not cold"
        WARNED_CACHE=1
    }
}

# Times one run of tool $1 on dataset $2, repeat $3; appends a row to raw.csv.
bench_one() {
    local tool=$1 name=$2 rep=$3 ds=$4 bytes=$5 files=$6
    local dst=$DST_ROOT/$tool/$name runlog=$LOGS/$name-$tool-$rep.log t0 t1 rc ok secs gbit fps reason
    rm -rf "${dst:?}"
    mkdir -p "$DST_ROOT/$tool"
    drop_caches
    t0=$EPOCHREALTIME
    set +e
    run_tool "$tool" "$name" >"$runlog" 2>&1
    rc=$?
    set -e
    sync
    t1=$EPOCHREALTIME
    ok=1
    if ((rc != 0)); then
        ok=0
        reason="exit status $rc: $(grep -m 1 -v '^ *$' "$runlog" || echo '(no output)')"
        echo "exit status $rc" >>"$runlog"
    elif ! verify_copy "$SRC_ROOT/$name" "$dst" "$STATE/$name.list" >>"$runlog" 2>&1; then
        ok=0
    fi
    rm -rf "${dst:?}"
    read -r secs gbit fps < <(awk -v a="$t0" -v b="$t1" -v by="$bytes" -v f="$files" \
        'BEGIN { s = b - a; printf "%.3f %.3f %.1f\n", s, by * 8 / s / 1e9, f / s }')
    echo "$ds,$tool,$rep,$secs,$bytes,$files,$gbit,$fps,$ok" >>"$OUT/raw.csv"
    if ((ok)); then
        log "  $ds r$rep $tool: $secs s, $gbit Gbit/s, $fps files/s"
    else
        FAILED=$((FAILED + 1))
        if ((rc == 0)); then
            reason=$(grep -m 1 '^verify:' "$runlog" || echo "verify failed")
        fi
        reason=$(cut -c1-200 <<<"$reason")
        FAIL_REASON["$ds $tool"]="$reason (logs/${runlog##*/})"
        log "  $ds r$rep $tool: FAILED ($reason)"
    fi
}

# --- ceilings -----------------------------------------------------------------------------------

ceilings() {
    local f=$OUT/ceilings.txt p bps rw direct fsync name
    : >"$f"
    log "ceilings: iperf3 loopback"
    if iperf3 -s -B 127.0.0.1 -p "$IPERF_PORT" -D -I "$STATE/iperf3.pid" \
        --logfile "$STATE/iperf3.log" && wait_port "$IPERF_PORT" 10; then
        for p in 1 4; do
            if iperf3 -c 127.0.0.1 -p "$IPERF_PORT" -P "$p" -t "$IPERF_TIME" -J \
                >"$LOGS/iperf3-P$p.json" 2>&1; then
                bps=$(jq '.end.sum_received.bits_per_second' "$LOGS/iperf3-P$p.json")
                awk -v b="$bps" -v p="$p" 'BEGIN { printf "iperf3 loopback, %d stream(s): %.1f Gbit/s\n", p, b / 1e9 }' >>"$f"
            else
                echo "iperf3 loopback, $p stream(s): failed" >>"$f"
            fi
        done
    else
        echo "iperf3: server did not start" >>"$f"
    fi
    stop_pidfile "$STATE/iperf3.pid" "iperf3"

    log "ceilings: fio ($FIO_SIZE file in $BENCH_DATA)"
    # Lay the file out once, then: cold reads (direct, buffered), writes (direct, buffered +
    # fsync at the end, so that write-back counts as it does in the transfers).
    fio --name=layout --filename="$BENCH_DATA/fio.dat" --rw=write --bs=1M --size="$FIO_SIZE" \
        --direct=1 --output="$LOGS/fio-layout.txt" >/dev/null 2>&1 || true
    for spec in "read 1" "read 0" "write 1" "write 0"; do
        read -r rw direct <<<"$spec"
        fsync=0
        [[ $rw == write && $direct == 0 ]] && fsync=1
        name="fio $rw 1 MiB $([[ $direct == 1 ]] && echo direct || echo buffered)"
        [[ $rw == read ]] && name="$name, cold"
        [[ $fsync == 1 ]] && name="$name, end_fsync"
        drop_caches
        if fio --name=ceiling --filename="$BENCH_DATA/fio.dat" --rw="$rw" --bs=1M \
            --size="$FIO_SIZE" --direct="$direct" --end_fsync="$fsync" --numjobs=1 \
            --output-format=json >"$LOGS/fio-$rw-d$direct.json" 2>&1; then
            jq -r --arg n "$name" --arg rw "$rw" \
                '.jobs[0][$rw].bw_bytes * 8 / 1e9 | "\($n): \(. * 10 | round / 10) Gbit/s"' \
                "$LOGS/fio-$rw-d$direct.json" >>"$f"
        else
            echo "$name: failed" >>"$f"
        fi
    done
    rm -f "$BENCH_DATA/fio.dat"
}

# --- summary ------------------------------------------------------------------------------------

summarize() {
    local md=$OUT/summary.md
    {
        echo "# Core transfer benchmark ($(date -I))"
        echo
        echo "Loopback, cold page cache before each run, wall time includes a final \`sync\`."
        echo "Scale $SCALE, seed $SEED, $REPEATS repeat(s), verify=$VERIFY," \
            "DMOVER_FLAGS='${DMOVER_FLAGS:-}', gridftp = globus-url-copy -r -cd $GRIDFTP_FLAGS." \
            "Machine: $(nproc) cores," \
            "$(uname -r), data on $(findmnt -no FSTYPE --target "$BENCH_DATA" 2>/dev/null || echo '?')."
        echo "Raw rows: raw.csv; machine and versions: machine.txt."
        echo
        echo "## Median throughput (Gbit/s; files/s in parentheses)"
        echo
        awk -F, -v datasets="$DATASETS" -v tools="$TOOLS" '
            NR > 1 && $9 == 1 { n[$1","$2]++; s[$1","$2, n[$1","$2]] = $4; by[$1] = $5; fi[$1] = $6 }
            function median(k,   m, i, j, t, a) {
                m = n[k]; for (i = 1; i <= m; i++) a[i] = s[k, i]
                for (i = 2; i <= m; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
                return (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
            }
            END {
                nt = split(tools, T, " "); nd = split(datasets, D, " ")
                printf "| dataset |"; for (i = 1; i <= nt; i++) printf " %s |", T[i]; print ""
                printf "|---|"; for (i = 1; i <= nt; i++) printf "---|"; print ""
                for (d = 1; d <= nd; d++) {
                    printf "| %s |", D[d]
                    for (i = 1; i <= nt; i++) {
                        k = D[d] "," T[i]
                        if (n[k]) { m = median(k); printf " %.2f (%.0f) |", by[D[d]] * 8 / m / 1e9, fi[D[d]] / m }
                        else printf " FAILED |"
                    }
                    print ""
                }
            }' "$OUT/raw.csv"
        echo
        echo "## Per dataset and tool"
        echo
        echo "| dataset | tool | ok/runs | median s | Gbit/s | files/s | min–max s | Gbit/s range |"
        echo "|---|---|---|---|---|---|---|---|"
        awk -F, -v datasets="$DATASETS" -v tools="$TOOLS" '
            NR > 1 { runs[$1","$2]++; by[$1] = $5; fi[$1] = $6 }
            NR > 1 && $9 == 1 { n[$1","$2]++; s[$1","$2, n[$1","$2]] = $4 }
            function median(k,   m, i, j, t, a) {
                m = n[k]; for (i = 1; i <= m; i++) a[i] = s[k, i]
                for (i = 2; i <= m; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
                lo = a[1]; hi = a[m]
                return (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
            }
            END {
                nt = split(tools, T, " "); nd = split(datasets, D, " ")
                for (d = 1; d <= nd; d++) for (i = 1; i <= nt; i++) {
                    k = D[d] "," T[i]
                    if (!runs[k]) continue
                    if (!n[k]) { printf "| %s | %s | 0/%d | | | | | |\n", D[d], T[i], runs[k]; continue }
                    m = median(k); g = by[D[d]] * 8 / 1e9
                    printf "| %s | %s | %d/%d | %.3f | %.3f | %.0f | %.3f–%.3f | %.3f–%.3f |\n",
                        D[d], T[i], n[k], runs[k], m, g / m, fi[D[d]] / m, lo, hi, g / hi, g / lo
                }
            }' "$OUT/raw.csv"
        echo
        echo "## Datasets"
        echo
        for ds in $DATASETS; do
            if [[ -n ${DS_INFO[$ds]:-} ]]; then echo "- $ds: ${DS_INFO[$ds]}"; fi
        done
        if [[ -s $OUT/ceilings.txt ]]; then
            echo
            echo "## Ceilings"
            echo
            sed 's/^/- /' "$OUT/ceilings.txt"
        fi
        if ((FAILED)); then
            echo
            echo "## Failures"
            echo
            echo "$FAILED run(s) failed (ok=0 in raw.csv). First line of the last failed log per row:"
            echo
            for key in "${!FAIL_REASON[@]}"; do
                echo "- $key: ${FAIL_REASON[$key]}"
            done | LC_ALL=C sort
        fi
    } >"$md"
}

# --- main ---------------------------------------------------------------------------------------

need_tools
need_dmover
need_mkdata
write_machine_info "$@"
echo "dataset,tool,repeat,seconds,bytes,files,gbit_s,files_s,ok" >"$OUT/raw.csv"
FAILED=0
declare -A DS_INFO=() FAIL_REASON=()
log "results in $OUT; data in $BENCH_DATA"

needs() { [[ " $TOOLS " == *" $1"* ]]; }
SERVER_OK_rsync=1 SERVER_OK_gridftp=1 SERVER_OK_dmover=1
if needs rsync; then start_rsyncd || SERVER_OK_rsync=0; fi
if needs gridftp; then start_gridftp || SERVER_OK_gridftp=0; fi
if needs dmover; then start_dmover || SERVER_OK_dmover=0; fi
((SERVER_OK_rsync)) || log "rsync daemon did not start; its rows will fail"
((SERVER_OK_gridftp)) || log "GridFTP server did not start; its rows will fail"
((SERVER_OK_dmover)) || log "dmover serve did not start (see $STATE/dmover.log); its rows will fail"

check_space
if [[ $CEILINGS == 1 ]]; then ceilings; fi

for ds in $DATASETS; do
    if ! name=$(make_dataset "$ds"); then
        DS_INFO[$ds]="generation failed: see logs/mkdata-*.log"
        for ((r = 1; r <= REPEATS; r++)); do
            for tool in $TOOLS; do
                echo "$ds,$tool,$r,0,0,0,0,0,0" >>"$OUT/raw.csv"
                FAILED=$((FAILED + 1))
            done
        done
        continue
    fi
    listing "$SRC_ROOT/$name" >"$STATE/$name.list"
    bytes=$(awk '$1 == "f" {s += $2} END {printf "%.0f", s}' "$STATE/$name.list")
    files=$(awk '$1 == "f" {n++} END {printf "%d", n}' "$STATE/$name.list")
    DS_INFO[$ds]="$name: $files files, $bytes bytes, $(awk '$1 == "d" {n++} END {printf "%d dirs, ", n}' "$STATE/$name.list")$(awk '$1 == "l" {n++} END {printf "%d symlinks", n}' "$STATE/$name.list")"
    log "$ds: ${DS_INFO[$ds]}"
    for ((r = 1; r <= REPEATS; r++)); do
        for tool in $TOOLS; do
            bench_one "$tool" "$name" "$r" "$ds" "$bytes" "$files"
        done
    done
done

summarize
log "done: $OUT/summary.md ($FAILED failed run(s))"
cat "$OUT/summary.md"
if [[ $STRICT == 1 ]] && ((FAILED)); then exit 1; fi
exit 0
