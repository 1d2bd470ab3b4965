#!/usr/bin/env python3
"""Sums Nsight Compute's per-launch gpu__time_duration.sum (ncu --csv --metrics
gpu__time_duration.sum ...) by kernel name and prints a table, largest first.
usage: ncu_summary.py NCU.csv"""
import csv
import sys

rows = {}
with open(sys.argv[1], newline="") as f:
    lines = [l for l in f if l.startswith('"')]  # ncu prints its own log lines too
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = r["Kernel Name"][:90]
    v = float(r["Metric Value"].replace(",", ""))
    unit = r.get("Metric Unit", "nsecond")
    ns = v * {"nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9}.get(unit, 1)
    n, t = rows.get(name, (0, 0.0))
    rows[name] = (n + 1, t + ns)
total = sum(t for _, t in rows.values()) or 1
print(f"{'kernel':90} {'launches':>8} {'total us':>10} {'share':>6}")
for name, (n, t) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
    print(f"{name:90} {n:8d} {t / 1e3:10.1f} {100 * t / total:5.1f}%")
print(f"{'all':90} {sum(n for n, _ in rows.values()):8d} {total / 1e3:10.1f}")
