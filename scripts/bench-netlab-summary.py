#!/usr/bin/env python3
"""Medians of scripts/bench-netlab.sh rows as a Markdown table.

Usage: scripts/bench-netlab-summary.py docs/bench/netlab-*.csv [--dmover-args "..."]
           [--metric gbit_per_s|steady_gbit_per_s] [--streams "1 8"]
One row per link rate x congestion control x RTT: median Gbit/s (fraction of the link
rate) of iperf3 and dmover at 1 and 8 streams, dmover's best over iperf3's best, and
the forwarder's median CPU (cores) and release lateness (mean / p99, us).
"""
import csv
import statistics
import sys
from collections import defaultdict


def main():
    args = sys.argv[1:]
    want_args = None
    if "--dmover-args" in args:
        i = args.index("--dmover-args")
        want_args = args[i + 1]
        del args[i : i + 2]
    metric = "gbit_per_s"
    if "--metric" in args:
        i = args.index("--metric")
        metric = args[i + 1]
        del args[i : i + 2]
    streams = (1, 8)
    if "--streams" in args:
        i = args.index("--streams")
        streams = tuple(int(x) for x in args[i + 1].split())
        del args[i : i + 2]
    rows = []
    for path in args:
        with open(path) as f:
            rows += list(csv.DictReader(f))
    cells = defaultdict(list)
    fwd = defaultdict(list)
    failed = []
    for r in rows:
        if not r["bytes"]:
            failed.append(r)
            continue
        if r["tool"] == "dmover" and want_args is not None and r["dmover_args"] != want_args:
            continue
        key = (r["rate"], r["cc"], int(r["rtt_ms"]))
        if not r.get(metric):
            continue
        cells[key + (r["tool"], int(r["streams"]))].append(float(r[metric]))
        fwd[key].append(
            (float(r["fwd_cpu_cores"]), float(r["fwd_late_mean_us"]), float(r["fwd_late_p99_us"]))
        )
    keys = sorted(
        {k[:3] for k in cells},
        key=lambda k: (float(k[0].rstrip("gbit")), k[1], k[2]),
    )
    heads = [f"{t} -P{p}" for t in ("iperf3", "dmover") for p in streams]
    print(
        "| link | cc | RTT ms | " + " | ".join(heads)
        + " | dmover best / iperf3 best | forwarder CPU, lateness mean / p99 |"
    )
    print("|---|---|---|" + "---|" * len(heads) + "---|---|")
    for k in keys:
        rate = float(k[0].rstrip("gbit"))
        out = []
        best = {}
        for tool in ("iperf3", "dmover"):
            for p in streams:
                v = cells.get(k + (tool, p))
                if not v:
                    out.append("–")
                    continue
                m = statistics.median(v)
                best[tool] = max(best.get(tool, 0.0), m)
                out.append(f"{m:.2f} ({m / rate:.2f}) n={len(v)}")
        ratio = (
            f"{best['dmover'] / best['iperf3']:.2f}"
            if best.get("iperf3") and "dmover" in best
            else "–"
        )
        f = fwd[k]
        cpu = statistics.median(x[0] for x in f)
        late = statistics.median(x[1] for x in f)
        p99 = statistics.median(x[2] for x in f)
        print(
            f"| {k[0]} | {k[1]} | {k[2]} | " + " | ".join(out)
            + f" | {ratio} | {cpu:.2f}, {late:.0f} / {p99:.0f} |"
        )


    for r in failed:
        print(
            f"\nFailed run (no result, not in the medians): {r['tool']} -P{r['streams']} "
            f"{r['rate']} {r['rtt_ms']} ms {r['cc']} rep {r['rep']} at {r['when']}"
        )


if __name__ == "__main__":
    main()
