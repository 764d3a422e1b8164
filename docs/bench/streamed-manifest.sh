#!/usr/bin/env bash
# A manifest whole (OLD build) against streamed in parts (NEW build) over emulated
# long links. Per lab (RTT at 1 Gbit/s): both builds serve the same tmpfs root in
# host b (OLD on :7700, NEW on :7701); host a pulls each dataset from each (and
# pushes it to each), interleaved, ROUNDS times, tmpfs at both ends (the network and
# the session's start-up, not the disk). Prints CSV:
#   rtt,direction,dataset,build,round,seconds,first_chunk_seconds,gbit_per_s,manifest_parts
# Usage (as root): docs/bench/streamed-manifest.sh OLD_BINARY NEW_BINARY
#   env: ROUNDS (5), RTTS ("50ms 200ms"), DATASETS ("tiny losf"), RATE (1gbit),
#        DIRECTIONS ("pull push")
set -euo pipefail
OLD=$(readlink -f "$1")
NEW=$(readlink -f "$2")
ROUNDS=${ROUNDS:-5}
RTTS=${RTTS:-"50ms 200ms"}
DATASETS=${DATASETS:-"tiny losf"}
RATE=${RATE:-1gbit}
DIRECTIONS=${DIRECTIONS:-"pull push"}
W=$(mktemp -d /dev/shm/dmover-streamed.XXXXXX)
cleanup() {
    pkill -f "serve --root $W/srv" 2>/dev/null || true
    "$NEW" netlab down --name streamed >/dev/null 2>&1 || true
    rm -rf "$W"
}
trap cleanup EXIT
mkdir -p "$W/srv" "$W/home"
for d in $DATASETS; do
    "$NEW" bench mkdata "$W/srv/$d" --profile "$d" >/dev/null
done
head -c 32 /dev/urandom | base64 >"$W/token"
chmod 600 "$W/token"
export HOME=$W/home
echo "rtt,direction,dataset,build,round,seconds,first_chunk_seconds,gbit_per_s,manifest_parts"
for rtt in $RTTS; do
    "$NEW" netlab down --name streamed >/dev/null 2>&1 || true
    "$NEW" netlab up --name streamed --rtt "$rtt" --rate "$RATE" >/dev/null
    for b in OLD:7700 NEW:7701; do
        bin=${b%%:*}
        ip netns exec dmnl-streamed-b "${!bin}" serve --root "$W/srv" \
            --listen "10.200.0.2:${b##*:}" --token-file "$W/token" \
            --state-dir "$W/state-${b##*:}" >"$W/serve-${b##*:}.log" 2>&1 &
    done
    sleep 1
    for round in $(seq 1 "$ROUNDS"); do
        for dir in $DIRECTIONS; do
        for d in $DATASETS; do
            for b in OLD:7700 NEW:7701; do
                bin=${b%%:*}
                rm -rf "$W/dst" "$W/srv/in"
                mkdir "$W/dst" "$W/srv/in"
                if [ "$dir" = pull ]; then
                    args=("dmover://10.200.0.2:${b##*:}/$d" "$W/dst/")
                else
                    args=("$W/srv/$d" "dmover://10.200.0.2:${b##*:}/in/")
                fi
                out=$(ip netns exec dmnl-streamed-a "${!bin}" cp --token-file "$W/token" \
                    --known-hosts "$W/kh" --json "${args[@]}" 2>/dev/null || true)
                python3 - "$rtt" "$dir" "$d" "$bin" "$round" "$out" <<'PY'
import json, sys
rtt, direction, d, b, rnd, out = sys.argv[1:]
try:
    j = json.loads(out)
except ValueError:
    print(f"{rtt},{direction},{d},{b},{rnd},,,,")
    sys.exit()
f = lambda v: "" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))
print(",".join([rtt, direction, d, b, rnd, f(j["seconds"]),
                 f(j.get("first_chunk_seconds")), f(j["gbit_per_s"]),
                 f(j.get("manifest_parts") or 1)]))
PY
            done
        done
        done
    done
    pkill -f "serve --root $W/srv" || true
    sleep 0.5
done
