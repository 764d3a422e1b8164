#!/usr/bin/env python3
"""Summarises docs/bench/tune-cells.sh's CSV: per link and dataset, the bound (the
longest of the best raw TCP, the cold read and the synced write), the median wall time
of each mode, and issue 13's ratios (also against the bound with raw TCP over as many
streams as the tuned copies ended with, the issue's "same stream count"); where the CSV has the local copy (disk to disk on
the same machine), a second table against this machine's bound, the longer of the raw
TCP time and that copy, with (where measured) both at once beside it (the median of
the `raw-and-copy` runs: the best raw TCP and the local copy started together, on the
cores they share; a comparison, not a bound: those tools spend more CPU on the work
than dmover does); where the CSV has the machine's CPU time of each measurement
(`cpu_s`), a third table against the CPU bound: the parts of the issue's bound (the
least CPU raw TCP spent, less its tool's start-up, the cold read's, the synced
write's) spent that much CPU one
after the other, and a copy does all three, so on CORES cores (--cores, default this
machine's) it takes at least their sum / CORES; with --svg FILE, a plot of wall time /
bound per cell and mode against the 1.15 goal.

    python3 docs/bench/tune-cells-summary.py cells.csv [--svg ratios.svg] [--cores N]
"""
import csv
import os
import statistics
import sys
from collections import defaultdict

MODES = ["tuned", "default", "best"]


def load(path):
    cells = defaultdict(lambda: {"raw": [], "read": None, "write": None, "copy": None, "both": [], "modes": defaultdict(list), "streams": [], "cpu": defaultdict(list)})
    order = []
    for r in csv.DictReader(open(path)):
        if not r["seconds"]:
            continue
        key = (float(r["rtt_ms"]), r["loss"], r["dataset"])
        if key not in cells:
            order.append(key)
        c = cells[key]
        c["bytes"] = int(r["bytes"])
        s = float(r["seconds"])
        if r.get("cpu_s"):
            kind = "raw" if r["mode"].startswith("raw-tcp") else r["mode"]
            c["cpu"][kind].append(float(r["cpu_s"]))
        if r["kind"] == "bound":
            if r["mode"].startswith("raw-tcp"):
                c["raw"].append((s, r["mode"]))
            # Each part of the bound is the best seen: a serial `cat` (the first
            # runs) and eight at once both measure the local read.
            elif r["mode"].startswith("cold-read"):
                c["read"] = min(s, c["read"] or s)
            elif r["mode"] == "sync-write":
                c["write"] = min(s, c["write"] or s)
            elif r["mode"].startswith("local-copy"):
                c["copy"] = min(s, c["copy"] or s)
            elif r["mode"] == "raw-and-copy":
                c["both"].append(s)
        else:
            c["modes"][r["mode"]].append(s)
            if r["mode"] == "tuned" and r["streams_end"]:
                c["streams"].append(r["streams_end"])
    return order, cells


def spread(xs):
    return (max(xs) - min(xs)) if xs else 0.0


def summarise(order, cells):
    rows = []
    for key in order:
        c = cells[key]
        raw, raw_how = min(c["raw"]) if c["raw"] else (0.0, "")
        bound = max(raw, c["read"] or 0.0, c["write"] or 0.0)
        limit = {raw: "network (" + raw_how[len("raw-tcp-"):] + ")", c["read"] or 0.0: "disk read", c["write"] or 0.0: "disk write"}[bound]
        med = {m: statistics.median(c["modes"][m]) for m in MODES if c["modes"][m]}
        # Raw TCP over the streams the tuned copies ended with most often.
        same = None
        if c["streams"]:
            n = max(set(c["streams"]), key=c["streams"].count)
            at_n = [s for s, how in c["raw"] if how.startswith(f"raw-tcp-P{n}-")]
            if at_n:
                same = max(min(at_n), c["read"] or 0.0, c["write"] or 0.0)
        rows.append({
            "key": key, "bytes": c["bytes"], "bound": bound, "limit": limit, "raw": raw,
            "read": c["read"], "write": c["write"], "copy": c["copy"], "med": med,
            "both": statistics.median(c["both"]) if c["both"] else None,
            "spread": {m: spread(c["modes"][m]) for m in MODES},
            "runs": {m: len(c["modes"][m]) for m in MODES},
            "streams": c["streams"], "same": same, "cpu": c["cpu"],
        })
    return rows


def table(rows):
    print("| RTT | loss | dataset | bound s (limit) | raw TCP s | cold read s | sync write s | tuned s | default s | best s | tuned / bound | tuned / bound at its streams | best / tuned rate | tuned − default s (spread) | tuned ended with |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        rtt, loss, ds = r["key"]
        m = r["med"]
        f = lambda v: "" if v is None else f"{v:.2f}"
        t, d, b = m.get("tuned"), m.get("default"), m.get("best")
        over = t / r["bound"] if t and r["bound"] else None
        vs_best = b / t if t and b else None
        vs_def = (t - d) if t and d else None
        sp = max(r["spread"]["tuned"], r["spread"]["default"])
        # A ratio is left empty when its modes were not run (e.g. MODES="tuned default").
        cell = lambda v, fmt: "" if v is None else fmt.format(v)
        print(f"| {rtt:g} ms | {loss} | {ds} | {r['bound']:.2f} ({r['limit']}) | {f(r['raw'])} | {f(r['read'])} | {f(r['write'])} "
              f"| {f(t)} | {f(d)} | {f(b)} | {cell(over, '**{:.2f}**')} "
              f"| {cell(t / r['same'] if t and r['same'] else None, '{:.2f}')} | {cell(vs_best, '{:.2f}')} "
              f"| {cell(vs_def, '{:+.2f}')}{cell(sp if vs_def is not None else None, ' ({:.2f})')} | {', '.join(r['streams'])} |")



def machine_table(rows):
    """Against the bound of a machine whose cores and disk both ends share: the longer
    of raw TCP and the local disk-to-disk copy; both at once beside it, and dmover's
    time against it."""
    rows = [r for r in rows if r["copy"]]
    if not rows:
        return
    print()
    print("| RTT | loss | dataset | raw TCP s | local copy s | machine bound s | tuned s | default s | tuned / machine bound | both at once s | tuned / both at once |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        rtt, loss, ds = r["key"]
        bound = max(r["raw"], r["copy"])
        t, d = r["med"].get("tuned"), r["med"].get("default")
        f = lambda v: "" if v is None else f"{v:.2f}"
        over = f"**{t / bound:.2f}**" if t else ""
        both = f"{t / r['both']:.2f}" if t and r["both"] else ""
        print(f"| {rtt:g} ms | {loss} | {ds} | {f(r['raw'])} | {f(r['copy'])} | {bound:.2f} | {f(t)} | {f(d)} | {over} | {f(r['both'])} | {both} |")


def cpu_table(rows, cores):
    """Against this machine's CPU bound (see the module docs)."""
    def least(r, kind):
        xs = r["cpu"].get(kind)
        return min(xs) if xs else None
    rows = [r for r in rows if all(least(r, k) is not None for k in ("raw", "cold-read-P8", "sync-write"))]
    if not rows:
        return
    print()
    print(f"| RTT | loss | dataset | issue's bound s | CPU s: raw TCP + read + write | CPU bound s (÷ {cores}) | bound s (the longer) | tuned s | tuned CPU s | tuned / bound | default s | default / bound |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        rtt, loss, ds = r["key"]
        # The raw TCP tool's own start-up (two Pythons) is no part of moving the bytes.
        parts = [least(r, "raw") - (least(r, "tool-start-raw-tcp") or 0.0), least(r, "cold-read-P8"), least(r, "sync-write")]
        cpu_bound = sum(parts) / cores
        bound = max(r["bound"], cpu_bound)
        t, d = r["med"].get("tuned"), r["med"].get("default")
        tc = r["cpu"].get("tuned")
        f = lambda v: "" if v is None else f"{v:.2f}"
        ratio = lambda v: "" if v is None else f"**{v / bound:.2f}**"
        print(f"| {rtt:g} ms | {loss} | {ds} | {r['bound']:.2f} | {' + '.join(f(p) for p in parts)} = {sum(parts):.2f} "
              f"| {cpu_bound:.2f} | {bound:.2f} | {f(t)} | {f(statistics.median(tc)) if tc else ''} | {ratio(t)} | {f(d)} | {ratio(d)} |")


def svg(rows, path):
    colours = {"tuned": "#1f77b4", "default": "#ff7f0e", "best": "#2ca02c"}
    bar, gap, left, top, height = 12, 16, 60, 30, 260
    width = left + len(rows) * (3 * bar + gap) + 140
    ymax = max([2.0] + [r["med"][m] / r["bound"] for r in rows for m in r["med"] if r["bound"]])
    y = lambda v: top + height - v / ymax * height
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{top + height + 90}" font-family="sans-serif" font-size="11">',
           f'<text x="{left}" y="16" font-size="13">Wall time / bound per cell (median; goal ≤ 1.15)</text>']
    for v in [0.5 * i for i in range(int(ymax / 0.5) + 1)]:
        out.append(f'<line x1="{left}" x2="{width - 140}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.1f}</text>')
    out.append(f'<line x1="{left}" x2="{width - 140}" y1="{y(1.15):.1f}" y2="{y(1.15):.1f}" stroke="#d62728" stroke-dasharray="5,3"/>')
    for i, r in enumerate(rows):
        x0 = left + gap / 2 + i * (3 * bar + gap)
        for j, m in enumerate(MODES):
            if m in r["med"] and r["bound"]:
                v = r["med"][m] / r["bound"]
                out.append(f'<rect x="{x0 + j * bar:.1f}" y="{y(v):.1f}" width="{bar - 1}" height="{y(0) - y(v):.1f}" fill="{colours[m]}"/>')
        rtt, loss, ds = r["key"]
        label = f"{rtt:g}ms{'' if loss == '0' else ' ' + loss} {ds}"
        cx = x0 + 1.5 * bar
        out.append(f'<text x="{cx:.1f}" y="{top + height + 12}" text-anchor="end" transform="rotate(-45 {cx:.1f} {top + height + 12})">{label}</text>')
    for j, m in enumerate(MODES):
        out.append(f'<rect x="{width - 120}" y="{top + j * 18}" width="10" height="10" fill="{colours[m]}"/>')
        out.append(f'<text x="{width - 104}" y="{top + j * 18 + 9}">{m}</text>')
    out.append("</svg>")
    open(path, "w").write("\n".join(out) + "\n")


def main():
    args = sys.argv[1:]
    svg_path = None
    cores = os.cpu_count() or 1
    if "--cores" in args:
        i = args.index("--cores")
        cores = int(args[i + 1])
        del args[i:i + 2]
    if "--svg" in args:
        i = args.index("--svg")
        svg_path = args[i + 1]
        del args[i:i + 2]
    order, cells = load(args[0])
    rows = summarise(order, cells)
    table(rows)
    machine_table(rows)
    cpu_table(rows, cores)
    if svg_path:
        svg(rows, svg_path)


if __name__ == "__main__":
    main()
