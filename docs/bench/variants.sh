# Sourced by the interleaved A/B scripts (ab-push.sh, pull-loopback.sh).

# parse_variants NAME=BINARY[:CP OPTIONS]...: fills the arrays names, bins (absolute
# paths) and opts (cp options as one string, split by the caller with `read -ra`).
parse_variants() {
    names=() bins=() opts=()
    local v name rest bin opt
    for v in "$@"; do
        name=${v%%=*} rest=${v#*=}
        bin=${rest%%:*}
        opt=""
        [ "$rest" != "$bin" ] && opt=${rest#*:}
        names+=("$name") bins+=("$(realpath "$bin")") opts+=("$opt")
    done
}

# medians CSV: each variant's median seconds, range and run count on stderr (the CSV
# has the columns variant and seconds).
medians() {
    python3 - "$1" >&2 <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
for v in dict.fromkeys(r["variant"] for r in rows):
    s = [float(r["seconds"]) for r in rows if r["variant"] == v]
    print(f"{v}: median {statistics.median(s):.3f} s ({min(s):.3f}-{max(s):.3f}), {len(s)} runs")
PY
}
