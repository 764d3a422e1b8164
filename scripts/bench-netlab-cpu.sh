#!/usr/bin/env bash
# CPU per GB of iperf3 and dmover side by side on one emulated link (dmover netlab).
# Usage (root): bench-netlab-cpu.sh OUT "RTTS" REPS "NAME=BINARY:LOWAT ..."
#   Per RTT one lab (RATE, default 5gbit; CC, default bbr), iperf3 -s and one
#   `dmover serve` per variant in host b; REPS rounds of iperf3 -P1/-P8 (IT s, default
#   10) then every variant's `dmover cp --json -P1/-P8` of SRC (a directory on tmpfs;
#   2026-11-23: 3 hard links of a 2 GB random file), received into tmpfs under DATA. Client CPU from
#   `perf stat -e task-clock`, server CPU from /proc/PID/stat (utime+stime), iperf3's
#   from its JSON (cpu_utilization_percent x seconds). LOWAT is passed to the client
#   as DMOVER_AB_LOWAT, which only the A/B build of 2026-11-23 read (0: unset);
#   ordinary builds ignore it. Run it under flock /work/bench.lock.
set -uo pipefail
OUT=$1; RTTS=$2; REPS=$3; VARIANTS=$4; RATE=${RATE:-5gbit}; CC=${CC:-bbr}
LAB=c5g; W=${WORK:-/tmp/bench-netlab-cpu}; mkdir -p $W; D=${DATA:-/dev/shm/bench-netlab-cpu}
B0=${NETLAB_DMOVER:-$(command -v dmover)}   # runs `netlab up/exec/down`
: "${SRC:?set SRC to the directory to push}"
[ -s $W/token ] || printf 'bench-netlab-cpu-%s' $$ > $W/token
[ -s "$OUT" ] || echo "rtt,variant,streams,rep,bytes,seconds,gbit,steady,cli_cpu_s,srv_cpu_s,cli_s_per_gb,srv_s_per_gb" > "$OUT"
cpu() { awk '{print ($14+$15)/100}' /proc/$1/stat; }
for rtt in $RTTS; do
  $B0 netlab down --name $LAB >/dev/null 2>&1
  $B0 netlab up --name $LAB --rtt ${rtt}ms --rate $RATE --congestion $CC >/dev/null || exit 1
  $B0 netlab exec --name $LAB b -- iperf3 -s -p 5301 >/dev/null 2>&1 &
  IP=$!
  declare -A SP=()
  port=7811
  for v in $VARIANTS; do
    name=${v%%=*}; rest=${v#*=}; bin=${rest%%:*}
    rm -rf $W/state-$name; mkdir -p $D/dst-$name
    setsid $B0 netlab exec --name $LAB b -- "$bin" serve --listen 10.200.0.2:$port --root $D/dst-$name --state-dir $W/state-$name --token-file $W/token >$W/serve-$name.log 2>&1 &
    SP[$name]=$!; eval "PORT_$name=$port"; port=$((port+1))
  done
  sleep 1.5
  for rep in $(seq 1 $REPS); do
    for p in 1 8; do
      j=$($B0 netlab exec --name $LAB a -- iperf3 -c 10.200.0.2 -p 5301 -t ${IT:-10} -P $p -J)
      python3 - "$rtt" "$p" "$rep" >>"$OUT" <<PY
import json,sys
e=json.loads('''$j''')["end"]; r=e["sum_received"]; c=e["cpu_utilization_percent"]
gb=r["bytes"]/1e9; s=r["seconds"]
hc=c["host_total"]/100*s; rc=c["remote_total"]/100*s
print(f"{sys.argv[1]},iperf3,{sys.argv[2]},{sys.argv[3]},{r['bytes']},{s:.2f},{r['bits_per_second']/1e9:.3f},,{hc:.2f},{rc:.2f},{hc/gb:.3f},{rc/gb:.3f}")
PY
      for v in $VARIANTS; do
        name=${v%%=*}; rest=${v#*=}; bin=${rest%%:*}; lowat=${rest#*:}
        eval "port=\$PORT_$name"
        spid=$(pgrep -s ${SP[$name]} -f "serve --listen" | head -1)
        s0=$(cpu $spid)
        rm -rf $D/dst-$name/run
        j=$(DMOVER_AB_LOWAT=$lowat DMOVER_KNOWN_HOSTS=$W/kh-$name-$rtt perf stat -x, -e task-clock -o $W/cstat timeout 150 $B0 netlab exec --name $LAB a -- "$bin" cp --json -P $p --token-file $W/token $SRC dmover://10.200.0.2:$port/run 2>$W/cp.err)
        s1=$(cpu $spid)
        rm -rf $D/dst-$name/run
        c=$(grep task-clock $W/cstat | cut -d, -f1)
        python3 - "$rtt" "$name" "$p" "$rep" "$c" "$s0" "$s1" >>"$OUT" <<PY
import json,sys
j=json.loads('''$j''')
a=sys.argv; gb=j["bytes"]/1e9; cs=float(a[5])/1000; ss=float(a[7])-float(a[6])
st=j.get("steady_gbit_per_s"); st="" if st is None else f"{st:.3f}"
print(f"{a[1]},{a[2]},{a[3]},{a[4]},{j['bytes']},{j['seconds']:.2f},{j['gbit_per_s']:.3f},{st},{cs:.2f},{ss:.2f},{cs/gb:.3f},{ss/gb:.3f}")
PY
        [ -n "$j" ] || { cat $W/cp.err; echo "$rtt,$name,$p,$rep,,timeout-150s,,,,,," >>"$OUT"; }
      done
    done
  done
  for n in "${!SP[@]}"; do kill -- -${SP[$n]} 2>/dev/null; done
  kill $IP 2>/dev/null; wait 2>/dev/null
  $B0 netlab down --name $LAB >/dev/null
done
