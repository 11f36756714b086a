"""Charges each sample of `go tool pprof -traces` output to a package of mwrpc.

Usage: go tool pprof -traces PROFILE > TRACES && python3 split.py TRACES

A sample counts for the innermost frame of the mwrpc module outside its internal/
helpers (idle polling, the clock), so time in the runtime, sync and atomics counts where
mwrpc's code called them; a sample with no mwrpc frame counts apart.
"""
import collections
import re
import sys

UNITS = {"s": 1, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}
SEPARATOR = "-----------+-------------------------------------------------------"


def package(frames):
    for f in frames:
        if "mwrpc/mwrpc/" not in f:
            continue
        p = re.match(r"[^.]*", f.split("mwrpc/mwrpc/", 1)[1]).group(0)  # no dots in its paths
        if not p.startswith("internal/"):
            return p
    return "runtime/other (no mwrpc frame)"


def main(path):
    by_pkg, total = collections.Counter(), 0.0
    for block in open(path).read().split(SEPARATOR):
        lines = [l.strip() for l in block.strip().split("\n") if l.strip()]
        m = lines and re.match(r"([\d.]+)(ms|s|us|µs)\s+(.*)", lines[0])
        if not m:
            continue
        v = float(m.group(1)) * UNITS[m.group(2)]
        by_pkg[package([m.group(3)] + lines[1:])] += v
        total += v
    for p, v in by_pkg.most_common():
        print(f"{v:6.2f} {100 * v / total:5.1f}% {p}")
    print(f"{total:6.2f} total")


if __name__ == "__main__":
    main(sys.argv[1])
