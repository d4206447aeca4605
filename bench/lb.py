"""Load-balancer benchmark, two parts.

Maglev itself: for N = 10, 100 and 1,000 members and M = 65,537 (the default table size), the table's build time in
C and in Python, the max/min share imbalance, and the fraction of entries that change when 1% of the members fail
(at least one), next to Maglev's paper (Eisenbud et al., NSDI 2016: near-perfect balance at M = 65,537; a failure
changes little more than the failed members' own entries).

The wire (bench/lb_wire.py): the Linux kernel (nftables DNAT through the same 65,537-slot Maglev map, conntrack)
and a tianji LB instance on each native fast path, in the same run, on the same generated traffic (a C generator):
forwarded 64-byte UDP packets/s over 1,000 flows, and new TCP connections/s (every SYN a new 5-tuple). Ratios are
tianji / kernel; the goal is at least 1.0x on both.

    python bench/lb.py [--m 65537] [--reps 5] [--wire] [--paths xdp,packet] [--seconds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nfv_gateways.roles.lb.maglev import build, member_key
from nfv_gateways.roles.lb.native import NativeMaglev


def timed(fn, reps: int) -> float:
    runs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=65537)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--wire", action="store_true", help="also the kernel comparison on the wire (root)")
    ap.add_argument("--paths", default="xdp,packet", help="the tianji fast paths to measure on the wire")
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    maglev_rows(args)
    if args.wire:
        wire_rows(args)


def wire_rows(args: argparse.Namespace) -> None:
    from bench.lb_wire import KERNEL_OVERLAY, KERNEL_PLAIN, compare

    rows = compare([p for p in args.paths.split(",") if p], args.seconds)
    same = {label: got for who, label, got, _ in rows if who == KERNEL_OVERLAY}
    plain = {label: got for who, label, got, _ in rows if who == KERNEL_PLAIN}
    print(f"\n{'balancer':<54} {'measure':<50} {'achieved/s':>11} {'offered/s':>10} {'x kernel':>9} "
          f"{'x plain':>8}")
    for who, label, got, offered in rows:
        print(f"{who:<54} {label:<50} {got:>11,.0f} {offered:>10,.0f} {got / same[label]:>8.2f}x "
              f"{got / plain[label]:>7.2f}x")


def maglev_rows(args: argparse.Namespace) -> None:
    c, m = NativeMaglev(), args.m
    print(f"Maglev, M = {m:,} (median of {args.reps} builds)")
    print(f"{'members':>8} {'build C':>10} {'build Python':>13} {'x':>6} {'max/min share':>14} "
          f"{'failed':>7} {'entries changed':>16} {'their own':>10}")
    for n in (10, 100, 1000):
        keys = [member_key(f"member-{i}") for i in range(n)]
        ones = [1] * n
        c_ms = timed(lambda keys=keys, ones=ones: c.build_raw(keys, ones, m), args.reps)
        py_ms = timed(lambda keys=keys, ones=ones: build(keys, ones, m), max(1, args.reps // 2))
        table = c.build(keys, ones, m)
        share = Counter(table)
        k = max(1, n // 100)
        after = c.build(keys, [0] * k + [1] * (n - k), m)
        changed = sum(a != b for a, b in zip(table, after, strict=True)) / m
        own = sum(1 for x in table if x < k) / m
        imbalance = max(share.values()) / min(share.values())
        print(f"{n:>8} {c_ms:>8.1f} ms {py_ms:>10.0f} ms {py_ms / c_ms:>5.0f}x {imbalance:>14.3f} "
              f"{k:>7} {changed:>15.2%} {own:>9.2%}")
    print("paper (NSDI 2016, M = 65,537): near-perfect balance; on failures, entries change little beyond the "
          "failed members' own")


if __name__ == "__main__":
    main()
