#!/usr/bin/env python3
"""Checks scripts/bench_report.py on made-up results whose verdicts are known:
each target is judged on the value it prints (0.966 shows 0.97 and meets
0.97), a variant that could not keep up with the half-load rate misses,
"met ... only" names the variants that meet a target when others do not,
targets whose variants did not run are left out, and the report says why
tower-rate-limiter's rows are absent when bench.sh could not build it.
.ci/run runs it.

    python3 scripts/bench_report_test.py
"""
import os
import subprocess
import sys
import tempfile
import unittest

REPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_report.py")


def sat(rnd, variant, rps, cmds=0.0, redis_cpu=0.0):
    # rps p50 p99 cpu cmds redis-cpu non-2xx user kernel
    return f"sat {rnd} {variant} {rps} 400 900 6.0 {cmds} {redis_cpu} 0 2.0 4.0"


def fixed(rnd, variant, rate, p99_us, dropped=0):
    return (f"fixed {rnd} {variant} {rate} sent={rate * 4} ok={rate * 4} rejected=0 errors=0 "
            f"dropped={dropped} rate={rate} p50_us=300 p99_us={p99_us} max_us=5000")


def targets(lines, rounds):
    """The targets table bench_report.py prints for LINES, as {target: (measured, verdict)}."""
    with tempfile.NamedTemporaryFile("w", suffix=".results", delete=False) as f:
        f.write("\n".join(lines) + "\n")
    try:
        out = subprocess.run([sys.executable, REPORT, f.name, "test machine", str(rounds), "5", "4", "64", "0.0"],
                             check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)
    rows = {}
    after = out.split("The targets, from this run", 1)
    if len(after) < 2:
        return rows
    for line in after[1].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] not in ("target", "---"):
            rows[cells[0]] = (cells[1], cells[2])
    return rows


class Targets(unittest.TestCase):
    def test_every_target_is_judged_on_the_value_it_prints(self):
        lines = []
        # Two rounds, the second twice as fast: ratios are per round.
        for rnd, scale in ((1, 1), (2, 2)):
            lines += [
                sat(rnd, "none", 100 * scale),
                sat(rnd, "governor", 99 * scale),
                sat(rnd, "memory", 82 * scale),
                sat(rnd, "memory-bare", 96.6 * scale),  # 0.966 of none: shown 0.97, met
                sat(rnd, "redis", 69.6 * scale, cmds=0.07, redis_cpu=6.04),  # 0.696: shown 0.70
                sat(rnd, "redis-bare", 65 * scale, cmds=0.07, redis_cpu=6.2),
                sat(rnd, "rival-redis", 58 * scale, cmds=1.0, redis_cpu=9.0),  # 69.6 / 58 = 1.2: met
            ]
        # Half of the no-limiter median (150) is 75 req/s; 37 is a quarter.
        for rnd in (1, 2):
            lines += [
                fixed(rnd, "none", 75, 1000),
                fixed(rnd, "redis", 75, 1504),  # +0.504 ms: shown +0.50, met
                fixed(rnd, "redis-bare", 75, 1100, dropped=1),  # could not keep up
                fixed(rnd, "none", 37, 500),
                fixed(rnd, "redis", 37, 5000),
            ]
        lines += ["hammer deny cache on 100000 100000 2", "hammer deny cache off 50000 50000 12000"]
        lines += ["failopen 64 400000 0", "failopen 2000 350000 12"]
        got = targets(lines, 2)
        self.assertEqual(got, {
            "memory store ≥ 0.97× of no limiter":
                ("with headers 0.82×; without headers 0.97×", "met without headers only"),
            "memory store not below tower_governor (neither sending headers)":
                ("without headers 0.98× of tower_governor", "missed"),
            "Redis store ≥ 0.7× of no limiter":
                ("with headers 0.70×; without headers 0.65×", "met with headers only"),
            "Redis store ≥ 1.2× tower-rate-limiter's Redis store":
                ("both with headers 1.20× of tower-rate-limiter", "met"),
            "≤ 6 µs of Redis CPU per decision":
                ("with headers 6.0 µs; without headers 6.2 µs", "met with headers only"),
            "≤ 0.5 ms added p99 at half load (75 req/s)":
                ("with headers +0.50 ms; without headers overloaded", "met with headers only"),
            "≤ 1 Redis command per request":
                ("with headers 0.07; without headers 0.07", "met"),
            "hammering client, deny cache on: Redis commands per rejection near 0 (below 0.001)":
                ("measured 0.0000", "met"),
            "saturated, with a healthy Redis: no decision fails open, at 64 and 2,000 connections":
                ("64 connections 0; 2000 connections 12", "met 64 connections only"),
        })

    def test_targets_whose_variants_did_not_run_are_left_out(self):
        got = targets([sat(1, "none", 100), sat(1, "memory", 98)], 1)
        self.assertEqual(got, {
            "memory store ≥ 0.97× of no limiter": ("with headers 0.98×", "met"),
        })

    def test_rival_target_is_judged_on_the_value_it_prints(self):
        # 1.196 shows 1.20 and meets 1.2; 1.19 misses.
        for redis, verdict in ((119.6, "met"), (119, "missed")):
            got = targets([sat(1, "none", 200), sat(1, "redis", redis), sat(1, "rival-redis", 100)], 1)
            self.assertEqual(got["Redis store ≥ 1.2× tower-rate-limiter's Redis store"][1], verdict)

    def test_without_the_rival_its_target_is_left_out_and_the_report_says_why(self):
        lines = [sat(1, "none", 100), sat(1, "redis", 80)]
        self.assertNotIn("Redis store ≥ 1.2× tower-rate-limiter's Redis store", targets(lines, 1))
        with tempfile.NamedTemporaryFile("w", suffix=".results", delete=False) as f:
            f.write("\n".join(lines) + "\n")
        try:
            out = subprocess.run([sys.executable, REPORT, f.name, "test machine", "1", "5", "4", "64", "0.0"],
                                 check=True, capture_output=True, text=True,
                                 env={**os.environ, "RIVAL_MISSING": "no nightly toolchain"}).stdout
        finally:
            os.unlink(f.name)
        self.assertIn("tower-rate-limiter 0.1.6 (rival, rival-redis): rows absent, no nightly toolchain.", out)

    def test_without_a_baseline_no_target_is_reported(self):
        self.assertEqual(targets([sat(1, "memory", 98), sat(1, "governor", 99)], 1), {})


if __name__ == "__main__":
    unittest.main()
