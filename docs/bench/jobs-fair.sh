#!/bin/bash
# The job service's fair share (issue 41, item 4; docs/benchmarks.md "Jobs: fair share
# between users"). Servers A (the data) and B (the destination) without credentials on
# loopback, and C, a server with four users running the job service. The users submit
# copies from A to B through C's REST API, all at once, each its whole backlog; the
# script polls the API as an admin about every second.
#
# Usage: DMOVER=path/to/dmover [JOBS="70 10 10 10"] [FILES=2000] [SIZE_KB=64]
#        [CONCURRENCY=4] [LINK=4] [WINDOW=10] [OUT=file.csv] bash jobs-fair.sh
#
# Each job copies one directory of FILES files of SIZE_KB KiB (the same source for
# every job) into a directory of its own on B, deleted once the job is done (so B's
# disk holds a few jobs at a time). The servers run at nice 10, so that the sampling
# keeps its pace on a busy machine; TMPDIR=/dev/shm keeps the disk out of it. Prints, per WINDOW seconds while every user still
# has queued jobs: the files completed per user (files under their final names at B,
# counted every second) and whether each is within ±20 % of the window's mean; then the most
# jobs seen running at once (all, and per user) against the limits, and each user's
# first and last job's start and end. OUT gets the per-second samples as CSV.
set -eu
DMOVER=${DMOVER:-dmover}
JOBS=${JOBS:-70 10 10 10}
FILES=${FILES:-2000}
SIZE_KB=${SIZE_KB:-64}
CONCURRENCY=${CONCURRENCY:-4}
LINK=${LINK:-4}
WINDOW=${WINDOW:-10}
W=$(mktemp -d)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2> /dev/null || true; done; wait 2> /dev/null || true; rm -rf "$W"' EXIT
mkdir -p "$W/a/src" "$W/b/in" "$W/c" "$W/state"
python3 - "$W/a/src" "$FILES" "$SIZE_KB" <<'EOF'
import os, sys
d, n, kb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    with open(os.path.join(d, f"f{i:05}"), "wb") as f:
        f.write(os.urandom(kb * 1024))
EOF

# A server on loopback: its address once it listens.
serve() {
  local name=$1; shift
  nice -n 10 "$DMOVER" serve "$@" > "$W/$name.out" 2> "$W/$name.log" &
  PIDS+=($!)
  while ! grep -qs "^dmover: listening on" "$W/$name.out"; do sleep 0.05; done
}
serve a --root "$W/a" --listen 127.0.0.1:0 --third-party --state-dir "$W/a.state"
serve b --root "$W/b" --listen 127.0.0.1:0 --third-party --state-dir "$W/b.state"
A=$(sed -n 's/^dmover: listening on //p' "$W/a.out")
B=$(sed -n 's/^dmover: listening on //p' "$W/b.out")

# C: four users (u0 is also the admin) and the job service.
USERS=()
{
  echo "state_dir = \"$W/state\""
  echo "[exports.c]"
  echo "path = \"$W/c\""
  i=0
  for n in $JOBS; do
    u=u$i
    USERS+=("$u")
    echo "[users.$u]"
    "$DMOVER" credential token "$W/$u.token" 2> /dev/null
    echo "exports = { c = \"rw\" }"
    i=$((i + 1))
  done
  echo "[jobs]"
  echo "enabled = true"
  echo "listen = \"127.0.0.1:0\""
  echo "concurrency = $CONCURRENCY"
  echo "link_concurrency = $LINK"
  echo "max_unfinished_per_user = 0"
  echo "admins = [\"u0\"]"
} > "$W/c.toml"
nice -n 10 "$DMOVER" serve --config "$W/c.toml" --listen 127.0.0.1:0 > "$W/c.out" 2> "$W/c.log" &
C=$!
PIDS+=($C)
while ! grep -qs "^dmover: jobs on" "$W/c.out"; do sleep 0.05; done
URL=$(sed -n 's/^dmover: jobs on //p' "$W/c.out")

# Every second from now: the admin's list of all jobs, and the files complete at B
# per user (final names only: a copy's file appears under its name when whole). Done
# jobs' copies are then counted and deleted, in the same loop (no sample sees one
# half-deleted), so B holds a few jobs' copies at a time.
start=$(date +%s%3N)
TOKEN0=$(cat "$W/u0.token")
touch "$W/counted"
(
  while [ ! -e "$W/stop" ]; do
    now=$(date +%s%3N)
    page=$(curl -sf -H "Authorization: Bearer $TOKEN0" "$URL/api/v1/jobs?limit=1000") || page='{"jobs": []}'
    files=$( (find "$W/b/in" -type f ! -name '.dmv.*' 2> /dev/null |
        sed -nE 's|.*/in/(u[0-9]+)-[0-9]+/.*|\1 1|p'; cat "$W/counted") |
      awk '{n[$1] += $2} END {printf "{"; s = ""; for (u in n) {printf "%s\"%s\": %d", s, u, n[u]; s = ", "} printf "}"}')
    echo "{\"t_ms\": $((now - start)), \"files\": $files, \"page\": $page}" >> "$W/samples.jsonl"
    echo "$page" > "$W/last.json"
    for d in $(echo "$page" | jq -r '.jobs[] | select(.state == "done") | .spec.destination' | sed 's|.*/in/||; s|/$||'); do
      [ -d "$W/b/in/$d" ] || continue
      n=$(find "$W/b/in/$d" -type f ! -name '.dmv.*' | wc -l)
      echo "${d%-*} $n" >> "$W/counted"
      rm -rf "${W:?}/b/in/$d"
    done
    sleep 0.5
  done
) &
PIDS+=($!)

# The users submit at once, each its whole backlog, one job after the other.
i=0
SUBMITTERS=()
for n in $JOBS; do
  u=u$i
  (
    for j in $(seq 1 "$n"); do
      mkdir -p "$W/b/in/$u-$j"
      curl -sf -H "Authorization: Bearer $(cat "$W/$u.token")" \
        -d "{\"sources\":[\"dmover://$A/src\"],\"destination\":\"dmover://$B/in/$u-$j/\"}" \
        "$URL/api/v1/jobs" > /dev/null
    done
  ) &
  SUBMITTERS+=($!)
  i=$((i + 1))
done
wait "${SUBMITTERS[@]}"
total=$(echo "$JOBS" | tr ' ' '+' | bc)
echo "submitted $total jobs in $(($(date +%s%3N) - start)) ms" >&2
# Until every job has ended.
while true; do
  sleep 1
  [ -s "$W/last.json" ] || continue
  ended=$(jq '[.jobs[] | select(.state != "queued" and .state != "running")] | length' "$W/last.json" 2> /dev/null || echo 0)
  [ "$ended" = "$total" ] && break
done
sleep 1.5
touch "$W/stop"
rss=$(grep VmHWM /proc/$C/status | awk '{print $2}')
echo "service (C) peak RSS: $rss kB" >&2

python3 - "$W/samples.jsonl" "$WINDOW" "$((FILES * SIZE_KB * 1024))" "$CONCURRENCY" "$LINK" "$FILES" "${OUT:-}" <<'EOF'
import json, sys
path, window, job_bytes, conc, link, files = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
out = sys.argv[7]
file_bytes = job_bytes / files
samples = [json.loads(l) for l in open(path)]
users = sorted({j["owner"] for s in samples for j in s["page"]["jobs"]})
rows = []
for s in samples:
    jobs = s["page"]["jobs"]
    row = {"t": s["t_ms"] / 1000}
    for u in users:
        mine = [j for j in jobs if j["owner"] == u]
        row[u + "_bytes"] = sum(j["bytes"] if j["state"] != "done" else j["bytes_total"] for j in mine)
        row[u + "_files"] = s["files"].get(u, 0)
        row[u + "_running"] = sum(j["state"] == "running" for j in mine)
        row[u + "_queued"] = sum(j["state"] == "queued" for j in mine)
    row["running"] = sum(row[u + "_running"] for u in users)
    rows.append(row)
if out:
    with open(out, "w") as f:
        keys = list(rows[0].keys())
        f.write(",".join(keys) + "\n")
        for r in rows:
            f.write(",".join(f"{r[k]:.3f}" if isinstance(r[k], float) else str(r[k]) for k in keys) + "\n")
# While every user has queued jobs: from the first sample where each has one to the
# first where one has none.
begin = next((r["t"] for r in rows if all(r[u + "_queued"] > 0 for u in users)), None)
if begin is None:
    print("no sample found every user with a queued job (backlogs too small)")
    begin = rows[-1]["t"]
end = next((r["t"] for r in rows if r["t"] > begin and any(r[u + "_queued"] == 0 for u in users)), rows[-1]["t"])
print(f"every user had queued jobs from t = {begin:.1f} s to {end:.1f} s; all ended at {rows[-1]['t']:.1f} s")
def at(t, u):
    # Files of user u complete at B at time t, linear between samples.
    prev = rows[0]
    for r in rows:
        if r["t"] >= t:
            if r["t"] == prev["t"]:
                return r[u + "_files"]
            f = (t - prev["t"]) / (r["t"] - prev["t"])
            return prev[u + "_files"] + f * (r[u + "_files"] - prev[u + "_files"])
        prev = r
    return rows[-1][u + "_files"]
print("window_s," + ",".join(f"{u}_files" for u in users) + ",mean,max_dev_pct,within_20pct")
t, ok_all, n = begin, True, 0
while t + window <= end:
    got = [at(t + window, u) - at(t, u) for u in users]
    mean = sum(got) / len(got)
    dev = max(abs(g - mean) for g in got) / mean * 100 if mean else 0
    ok = dev <= 20
    ok_all &= ok
    n += 1
    print(f"{t:.1f}-{t + window:.1f}," + ",".join(f"{g:.0f}" for g in got) + f",{mean:.0f},{dev:.1f},{'yes' if ok else 'NO'}")
    t += window
print(f"windows: {n}, all within ±20 %: {'yes' if ok_all else 'NO'}")
# Every window of that length starting each second of the phase.
worst, t = 0.0, begin
while t + window <= end:
    got = [at(t + window, u) - at(t, u) for u in users]
    mean = sum(got) / len(got)
    if mean:
        worst = max(worst, max(abs(g - mean) for g in got) / mean * 100)
    t += 1
print(f"sliding {window:.0f} s windows (1 s steps): worst deviation from the mean {worst:.1f} %")
print(f"most jobs running at once: {max(r['running'] for r in rows)} (concurrency {conc}, link limit {link}; one link)")
print("most running at once per user: " + ", ".join(f"{u} {max(r[u + '_running'] for r in rows)}" for u in users))
last = samples[-1]["page"]["jobs"]
for u in users:
    mine = [j for j in last if j["owner"] == u]
    t0 = min(j["created_ms"] for j in last)
    first = min(j["started_ms"] for j in mine)
    lastend = max(j["ended_ms"] for j in mine)
    states = {}
    for j in mine:
        states[j["state"]] = states.get(j["state"], 0) + 1
    print(f"{u}: {len(mine)} jobs {states}, first start {(first - t0) / 1000:.1f} s, last end {(lastend - t0) / 1000:.1f} s")
EOF
