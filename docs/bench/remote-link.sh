#!/usr/bin/env bash
# Seed 000's workloads A-D over an emulated long link (issue 14): dmover through the
# library API and through `dmover mount`, sshfs and `rclone mount` (sftp backend) of
# the same server directory, and `dmover cp` of the same amount of data, cold cache
# (the page cache is dropped once the test files are on the server), plus 4 KiB random
# reads against the link's own request/response time (raw TCP) and the disk's (fio).
#
#   DMOVER=target/release/dmover RTTS="50 200" ROUNDS=3 bash docs/bench/remote-link.sh > out.csv
#   python3 docs/bench/remote-link-summary.py out.csv      # the tables of docs/benchmarks.md
#
# Settings (environment): RTTS, ROUNDS (FIRST_ROUND to continue a run), WORKLOADS
# ("A B C D"), VIEWS ("api mount sshfs rclone cp local"; local: the same workload in the
# server's directory itself, local disk), WRITE_SECONDS and RANDOM_SECONDS (10),
# PEER_SECONDS (30: sshfs and rclone read for at most this long), LIMIT (240 s per
# measurement), KEEP_LOGS=DIR.
#
# Needs root, /dev/fuse, sshfs, rclone, openssh-server, fio, python3. Per RTT it brings
# up `dmover netlab up --rtt RTT --rate 1gbit`; the far namespace (b) runs `dmover
# serve` and a private sshd (its own keys and config, internal-sftp) over one
# directory on this machine's disk; the near one (a) mounts sshfs and rclone and runs
# every measurement. Prints one CSV line per run; removes what it made.
set -euo pipefail
DMOVER=$(realpath "${DMOVER:-$(command -v dmover)}")
RTTS=${RTTS:-"50 200"}
ROUNDS=${ROUNDS:-3}
WORKLOADS=${WORKLOADS:-"A B C D"}
VIEWS=${VIEWS:-"api mount sshfs rclone cp local"}
WRITE_SECONDS=${WRITE_SECONDS:-10}
RANDOM_SECONDS=${RANDOM_SECONDS:-10}
# sshfs and rclone read a workload for at most this long (their rate is that of the
# part read; dmover's views and cp read every file).
PEER_SECONDS=${PEER_SECONDS:-30}
# The longest one measurement may take (then it is killed and its row says "failed").
LIMIT=${LIMIT:-240}
WORK=$(mktemp -d /var/tmp/dmover-remote-link.XXXXXX)
NAME=rlk$$
A=dmnl-$NAME-a B=dmnl-$NAME-b FAR=10.200.0.2 PORT=17810 SSHPORT=2299
export DMOVER_KNOWN_HOSTS=$WORK/known_hosts
BLOCK=$((128 << 10))

cleanup() {
    for m in "$WORK"/mnt-*; do
        [ -d "$m" ] && { umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; }
    done
    [ -f "$WORK/serve.pid" ] && kill "$(cat "$WORK/serve.pid")" 2>/dev/null || true
    [ -f "$WORK/sshd.pid" ] && kill "$(cat "$WORK/sshd.pid")" 2>/dev/null || true
    "$DMOVER" netlab down --name "$NAME" >/dev/null 2>&1 || true
    # KEEP_LOGS=DIR: the benches' and the server's logs are copied there first.
    if [ -n "${KEEP_LOGS:-}" ]; then cp "$WORK"/*.log "$KEEP_LOGS"/ 2>/dev/null || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT

# ssh: a throwaway key pair and an sshd that serves sftp only.
mkdir -p /run/sshd "$WORK/ssh"
ssh-keygen -q -t ed25519 -N '' -f "$WORK/ssh/host"
ssh-keygen -q -t ed25519 -N '' -f "$WORK/ssh/user"
cp "$WORK/ssh/user.pub" "$WORK/ssh/authorized_keys"
cat >"$WORK/ssh/sshd_config" <<EOF
Port $SSHPORT
ListenAddress $FAR
HostKey $WORK/ssh/host
AuthorizedKeysFile $WORK/ssh/authorized_keys
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
PidFile $WORK/sshd.pid
Subsystem sftp internal-sftp
EOF
cat >"$WORK/ssh/ssh_config" <<EOF
Host far
  HostName $FAR
  Port $SSHPORT
  User root
  IdentityFile $WORK/ssh/user
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
EOF
head -c 32 /dev/urandom | base64 >"$WORK/token"
ROOT=$WORK/root
mkdir -p "$ROOT/data"

cold() { sync; echo 3 >/proc/sys/vm/drop_caches; }

# to_csv LABEL: `dmover bench remote --json` on stdin, its rows as CSV lines.
to_csv() {
    python3 -c '
import json, sys
rtt, label, rnd = sys.argv[1:4]
try:
    rows = json.load(sys.stdin)["rows"]
except ValueError:
    rows = []
    print(f"{rtt},{rnd},,{label},failed")
for r in rows:
    print(",".join(str(x) for x in [rtt, rnd, r["workload"], label, r["op"], r["pattern"],
        r["files"], r["file_size"], r["block"], r["ops"], r["seconds"], r["mib_per_s"],
        r["p50_us"], r["p90_us"], r["p99_us"], r["p999_us"], r["max_us"], r["errors"]]))
' "$RTT" "$1" "$ROUND"
}

# wants VIEW: whether VIEWS has it.
wants() { case " $VIEWS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# bench LABEL ARGS...: one `dmover bench remote` in the near namespace (API or mount).
bench() {
    local label=$1
    shift
    wants "$label" || return 0
    timeout -k 10 "$LIMIT" ip netns exec "$A" "$DMOVER" bench remote \
        "dmover://$FAR:$PORT/data" --token-file "$WORK/token" --json "$@" \
        2>>"$WORK/bench.log" | to_csv "$label" || true
}

# peer sshfs|rclone ARGS...: the same through a mount of the same directory made in
# the near namespace (its mount namespace: one shell there mounts, measures, unmounts).
peer() {
    local p=$1
    shift
    wants "$p" || return 0
    LIMIT=$LIMIT ip netns exec "$A" bash -c '
        W=$1 p=$2 D=$3 URL=$4; shift 4
        if [ "$p" = sshfs ]; then
            sshfs -F "$W/ssh/ssh_config" far:"$W/root/data" "$W/mnt-sshfs" || exit 1
        else
            RCLONE_CONFIG_FAR_TYPE=sftp RCLONE_CONFIG_FAR_HOST=10.200.0.2 \
            RCLONE_CONFIG_FAR_PORT=2299 RCLONE_CONFIG_FAR_USER=root \
            RCLONE_CONFIG_FAR_KEY_FILE="$W/ssh/user" \
            RCLONE_CONFIG_FAR_SHELL_TYPE=none RCLONE_CONFIG_FAR_DISABLE_HASHCHECK=true \
                rclone mount far:"$W/root/data" "$W/mnt-rclone" --daemon --config /dev/null \
                --dir-cache-time 1s || exit 1
        fi
        timeout -k 10 "$LIMIT" "$D" bench remote "$URL" --token-file "$W/token" --json \
            "$@" --via dir --dir "$W/mnt-$p"
        umount "$W/mnt-$p" 2>/dev/null || umount -l "$W/mnt-$p"
        pkill -x rclone || true
    ' _ "$WORK" "$p" "$DMOVER" "dmover://$FAR:$PORT/data" "$@" 2>>"$WORK/bench.log" |
        to_csv "$p" || true
}

# local_disk ARGS...: the same workload in the server's directory itself (`--via dir`
# on this machine's disk: the reference the remote views are compared with).
local_disk() {
    wants local || return 0
    timeout -k 10 "$LIMIT" ip netns exec "$A" "$DMOVER" bench remote \
        "dmover://$FAR:$PORT/data" --token-file "$WORK/token" --json "$@" \
        --via dir --dir "$ROOT/data" 2>>"$WORK/bench.log" | to_csv local || true
}

# timed_cp OP SRC DST: one cold `dmover cp` in the near namespace, timed from start to
# exit, as a CSV line (uses w, n, bytes of the workload).
timed_cp() {
    cold
    local t0 t1
    t0=$(date +%s.%N)
    ip netns exec "$A" "$DMOVER" cp --quiet --token-file "$WORK/token" "$2" "$3" \
        2>>"$WORK/bench.log"
    t1=$(date +%s.%N)
    python3 -c "
s = $t1 - $t0
print(f'$RTT,$ROUND,$w,cp,$1,sequential,$n,$bytes,$BLOCK,,{s:.3f},{$n * $bytes / s / 2**20:.1f},,,,,,0')"
}

echo "rtt_ms,round,workload,via,op,pattern,files,file_size,block,ops,seconds,mib_per_s,p50_us,p90_us,p99_us,p999_us,max_us,errors"
for RTT in $RTTS; do
    "$DMOVER" netlab up --name "$NAME" --rtt "${RTT}ms" --rate 1gbit >/dev/null
    ip netns exec "$B" /usr/sbin/sshd -f "$WORK/ssh/sshd_config"
    ip netns exec "$B" "$DMOVER" serve --root "$ROOT" --listen "$FAR:$PORT" \
        --token-file "$WORK/token" --state-dir "$WORK/state" >"$WORK/serve.log" 2>&1 &
    echo $! >"$WORK/serve.pid"
    sleep 1
    # The mounts live in the near namespace's mount namespace: one shell there runs
    # them and the views through them, so each view is a plain directory to it.
    mkdir -p "$WORK/mnt-sshfs" "$WORK/mnt-rclone"
    for ROUND in $(seq "${FIRST_ROUND:-1}" "$ROUNDS"); do
        for spec in "A 1 128M" "B 10 16M" "C 100 2M" "D 1000 256K"; do
            set -- $spec
            w=$1 n=$2 size=$3
            case " $WORKLOADS " in *" $w "*) ;; *) continue ;; esac
            bytes=$(numfmt --from=iec "$size")
            ops=$((bytes / BLOCK))
            seq_args=(--workload "$w" --file-size "$size" --block 128K --pattern sequential
                --ops "$ops" --cold)
            bench api "${seq_args[@]}" --via api --seconds 300
            bench mount "${seq_args[@]}" --via mount --seconds 300
            peer sshfs "${seq_args[@]}" --seconds "$PEER_SECONDS"
            peer rclone "${seq_args[@]}" --seconds "$PEER_SECONDS"
            local_disk "${seq_args[@]}" --seconds 300
            # dmover cp of the same amount of data (n files of size), cold: pulled (the
            # reads' reference) and pushed (the writes').
            if wants cp; then
                rm -rf "$ROOT/data/cp-$w" "$WORK/pulled" "$WORK/push"
                mkdir -p "$ROOT/data/cp-$w" "$WORK/pulled" "$WORK/push/cp-$w"
                for i in $(seq 1 "$n"); do
                    head -c "$bytes" /dev/urandom >"$ROOT/data/cp-$w/f$i"
                    head -c "$bytes" /dev/urandom >"$WORK/push/cp-$w/f$i"
                done
                timed_cp read "dmover://$FAR:$PORT/data/cp-$w" "$WORK/pulled/"
                rm -rf "$ROOT/data/cp-$w"
                timed_cp write "$WORK/push/cp-$w" "dmover://$FAR:$PORT/data/"
                rm -rf "$ROOT/data/cp-$w" "$WORK/pulled" "$WORK/push"
            fi
            # Writes of new files, each uploaded whole at its close (API, mount) or
            # written through (sshfs, rclone without its cache), for WRITE_SECONDS.
            w_args=(--workload "$w" --mix write --file-size "$size" --block 128K
                --seconds "$WRITE_SECONDS")
            bench api "${w_args[@]}" --via api
            bench mount "${w_args[@]}" --via mount
            peer sshfs "${w_args[@]}"
            peer rclone "${w_args[@]}"
            local_disk "${w_args[@]}"
        done
        # 4 KiB random reads of one 256 MiB file, cold, one at a time.
        r_args=(--workload A --file-size 256M --block 4K --pattern random
            --seconds "$RANDOM_SECONDS" --cold)
        bench api "${r_args[@]}" --via api
        bench mount "${r_args[@]}" --via mount
        peer sshfs "${r_args[@]}"
        peer rclone "${r_args[@]}"
        local_disk "${r_args[@]}"
    done
    # The link's own 4 KiB request/response time (raw TCP, cubic, one connection) and
    # the disk's cold 4 KiB random read (fio, direct I/O): the random reads' bound.
    cat >"$WORK/rr.py" <<'EOF'
import socket, statistics, sys, time
host, port, role = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if role == "s":
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"cubic")
    l.bind((host, port)); l.listen(1)
    c, _ = l.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    blob = bytes(4096)
    while c.recv(8):
        c.sendall(blob)
else:
    c = socket.create_connection((host, port)); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    lat = []
    for _ in range(60):
        t = time.perf_counter(); c.sendall(b"x" * 8); got = 0
        while got < 4096:
            got += len(c.recv(4096 - got))
        lat.append((time.perf_counter() - t) * 1e6)
    lat = lat[10:]
    print(f"{statistics.median(lat):.0f},{min(lat):.0f}")
EOF
    ip netns exec "$B" python3 "$WORK/rr.py" "$FAR" 17999 s &
    sleep 0.5
    rr=$(ip netns exec "$A" python3 "$WORK/rr.py" "$FAR" 17999 c)
    wait $! 2>/dev/null || true
    echo "$RTT,,A,raw-tcp-4k-request,read,random,1,,4096,50,,,${rr%,*},,,,,0"
    head -c 256M /dev/urandom >"$ROOT/fio-file"
    cold
    fio --name=r --filename="$ROOT/fio-file" --rw=randread --bs=4k --direct=1 --iodepth=1 \
        --runtime=5 --time_based --output-format=json 2>/dev/null | python3 -c '
import json, sys
j = json.load(sys.stdin)["jobs"][0]["read"]
p = {k: v / 1000 for k, v in j["clat_ns"]["percentile"].items()}
n, p50, p90, p99 = j["total_ios"], p["50.000000"], p["90.000000"], p["99.000000"]
print(f"{sys.argv[1]},,A,fio-cold-4k,read,random,1,,4096,{n},5,,{p50:.1f},{p90:.1f},{p99:.1f},,,0")
' "$RTT"
    rm -f "$ROOT/fio-file"
    kill "$(cat "$WORK/serve.pid")" "$(cat "$WORK/sshd.pid")" 2>/dev/null || true
    rm -f "$WORK/serve.pid" "$WORK/sshd.pid"
    wait 2>/dev/null || true
    "$DMOVER" netlab down --name "$NAME" >/dev/null
done
