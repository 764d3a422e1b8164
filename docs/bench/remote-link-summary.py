#!/usr/bin/env python3
"""Medians of docs/bench/remote-link.sh's CSV, as the markdown tables of
docs/benchmarks.md ("Remote access over long links"), and issue 14's goals checked.

    python3 docs/bench/remote-link-summary.py docs/bench/remote-link-2026-11-27.csv
"""
import csv
import statistics
import sys
from collections import defaultdict

rows = [r for r in csv.DictReader(open(sys.argv[1])) if r.get("op")]
med = defaultdict(list)
for r in rows:
    key = (r["rtt_ms"], r["workload"], r["via"], r["op"], r["pattern"])
    med[key].append(r)


def m(key, col):
    vals = [float(r[col]) for r in med.get(key, []) if r.get(col) not in (None, "")]
    return statistics.median(vals) if vals else None


def f(x, nd=1):
    return "–" if x is None else f"{x:,.{nd}f}"


rtts = sorted({r["rtt_ms"] for r in rows}, key=float)
views = ["api", "mount", "sshfs", "rclone", "cp", "local"]
for op, title in [("read", "Sequential reads of every file once"), ("write", "Writes of new files")]:
    print(f"\n**{title}** (MiB/s, median of {max(len(v) for v in med.values())} rounds)\n")
    print("| RTT | workload | " + " | ".join(views) + " | mount / cp | mount / sshfs | goal min(5 × sshfs, 0.8 × cp) | met |")
    print("|---|---|" + "---|" * (len(views) + 4))
    for rtt in rtts:
        for w in "ABCD":
            # A write's rate is that of the files closed (uploaded), the `close` row.
            o = "close" if op == "write" else "read"
            vals = {v: m((rtt, w, v, o if v != "cp" else op, "sequential"), "mib_per_s") for v in views}
            if all(x is None for x in vals.values()):
                continue
            mount, cp, sshfs = vals["mount"], vals["cp"], vals["sshfs"]
            goal = None
            if cp is not None and sshfs is not None:
                goal = min(5 * sshfs, 0.8 * cp)
            met = "–" if goal is None or mount is None else ("yes" if mount >= goal else "**no**")
            ratio = lambda a, b: "–" if a is None or not b else f"{a / b:.2f}"
            print(f"| {rtt} ms | {w} | " + " | ".join(f(vals[v]) for v in views)
                  + f" | {ratio(mount, cp)} | {ratio(mount, sshfs)} | {f(goal)} | {met} |")

print("\n**4 KiB random reads, one 256 MiB file, cold, one at a time** (p50 / p99 in ms, median of rounds)\n")
print("| RTT | API | mount | sshfs | rclone | local | raw TCP 4 KiB answer (p50) | fio cold 4 KiB (p50) | bound: raw TCP + fio + 1 ms | met (API, mount) |")
print("|---|---|---|---|---|---|---|---|---|---|")
for rtt in rtts:
    cell = {}
    for v in ["api", "mount", "sshfs", "rclone", "local"]:
        p50, p99 = m((rtt, "A", v, "read", "random"), "p50_us"), m((rtt, "A", v, "read", "random"), "p99_us")
        cell[v] = (p50, p99)
    raw = m((rtt, "A", "raw-tcp-4k-request", "read", "random"), "p50_us")
    fio = m((rtt, "A", "fio-cold-4k", "read", "random"), "p50_us")
    if raw is None and all(c[0] is None for c in cell.values()):
        continue
    bound = None if raw is None or fio is None else raw + fio + 1000
    met = "–" if bound is None else ", ".join(
        "yes" if cell[v][0] is not None and cell[v][0] <= bound else "**no**" for v in ["api", "mount"])
    fmt = lambda c: "–" if c[0] is None else f"{c[0] / 1000:.2f} / {c[1] / 1000:.1f}"
    print(f"| {rtt} ms | " + " | ".join(fmt(cell[v]) for v in ["api", "mount", "sshfs", "rclone", "local"])
          + f" | {f(raw and raw / 1000, 2)} | {f(fio and fio / 1000, 3)} | {f(bound and bound / 1000, 2)} | {met} |")

fails = [r for r in rows if r.get("errors") not in ("0", "", None)]
print(f"\nRuns with failed I/Os: {len(fails)}" + "".join(
    f"\n- {r['rtt_ms']} ms {r['workload']} {r['via']} {r['op']}: {r['errors']}" for r in fails))
