#!/usr/bin/env python3
"""The report of scripts/bench.sh: Markdown tables of the medians of its
results file, ratios to the no-limiter baseline, the fixed-rate latencies,
the hammering client, and the performance targets with their verdicts.

    python3 scripts/bench_report.py RESULTS MACHINE ROUNDS SECS FIXED_SECS CONNS STEAL

RESULTS has one line per measurement, as bench.sh writes them:
    sat ROUND VARIANT RPS P50_US P99_US CPU_US CMDS REDIS_CPU_US NON2XX USER_US KERNEL_US
    fixed ROUND VARIANT RATE sent=… ok=… rejected=… errors=… dropped=… rate=… p50_us=… p99_us=… max_us=…
    hammer deny cache on|off REQUESTS REJECTED COMMANDS
    failopen CONNECTIONS REQUESTS DECISIONS_WITHOUT_THE_STORE
When the environment has RIVAL_MISSING (bench.sh could not build
tools/rival), the report says why the rival's rows are absent.
scripts/bench_report_test.py checks it on made-up results.
"""
import os, sys, statistics as st
path, machine, rounds, secs, fsecs, conns, steal = sys.argv[1:]
sat, fix, ham, fo = {}, {}, [], []
for line in open(path):
    f = line.split()
    if f[0] == "sat":
        sat.setdefault(f[2], []).append([float(x) for x in f[3:12]])
    elif f[0] == "fixed":
        kv = dict(x.split("=") for x in f[4:])
        fix.setdefault(int(f[3]), {}).setdefault(f[2], []).append((float(kv["p50_us"]), float(kv["p99_us"]),
            int(kv["errors"]) + int(kv["dropped"]), float(kv["rate"]), float(f[3])))
    elif f[0] == "hammer":
        label = " ".join(f[1:4])
        ham.append((label, *map(float, f[4:7])))
    elif f[0] == "failopen":
        fo.append(tuple(map(int, f[1:4])))
med = st.median
def per_round(v, against="none"):
    """V's rate over AGAINST's, round by round (None when either did not run)."""
    if v not in sat or against not in sat:
        return None
    return [x[0] / b[0] for x, b in zip(sat[v], sat[against])]
known = ["none", "none-headers", "governor", "governor-headers", "memory", "memory-bare", "redis", "redis-bare",
         "redis-tls", "redis-tls-bare", "multiplexed", "naive", "rival", "rival-redis"]
names = {"none": "no limiter", "none-headers": "no limiter, four constant x-ratelimit-* headers",
         "governor": "tower_governor 0.8 (memory)",
         "governor-headers": "tower_governor 0.8, use_headers() (2 headers)", "memory": "tower-ratelimit, memory",
         "memory-bare": "tower-ratelimit, memory, no headers",
         "redis": "tower-ratelimit, Redis",
         "redis-bare": "tower-ratelimit, Redis, no headers",
         "redis-tls": "tower-ratelimit, Redis over TLS",
         "redis-tls-bare": "tower-ratelimit, Redis over TLS, no headers",
         "multiplexed": "one shared multiplexed connection + EVALSHA per request",
         "naive": "naive deadpool + EVALSHA per request",
         "rival": "tower-rate-limiter 0.1.6, memory",
         "rival-redis": "tower-rate-limiter 0.1.6, Redis"}
# VARIANT@base: the same variant built from the baseline revision (BASE_REV).
for v in known:
    names[v + "@base"] = names[v] + " (baseline revision)"
order = [v for k in known for v in (k, k + "@base") if v in sat]
base = med([s[0] for s in sat["none"]]) if "none" in sat else None
fixed_note = f"fixed rate: tools/src/bin/loadgen.rs for {fsecs}s. " if fix else ""
print(f"\nMachine: {machine}. {rounds} interleaved rounds; saturation: wrk -t2 -c{conns} -d{secs}s; "
      f"{fixed_note}Medians over rounds. "
      f"CPU steal during the run: {steal}% (time the hypervisor gave to other guests; "
      f"above a few percent, latencies and absolute rates are the host's, not the code's).\n")
print("| variant | req/s | × no limiter | p50 | p99 | app CPU µs/req (user + kernel) | Redis cmds/req | Redis CPU µs/req |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for v in order:
    s = sat[v]
    rps = med([x[0] for x in s])
    ratio = f"{rps / base:.2f}×" if base else "-"
    non2xx = sum(x[6] for x in s)
    note = f" ({int(non2xx)} non-2xx)" if non2xx else ""
    print(f"| {names[v]}{note} | {rps:,.0f} | {ratio} | {med([x[1] for x in s]) / 1000:.2f} ms | "
          f"{med([x[2] for x in s]) / 1000:.2f} ms | {med([x[3] for x in s]):.1f} "
          f"({med([x[7] for x in s]):.1f} + {med([x[8] for x in s]):.1f}) | "
          f"{med([x[4] for x in s]):.2f} | {med([x[5] for x in s]):.1f} |")
if "none" in sat and len(sat["none"]) > 1:
    # Each round against that round's no-limiter rate: the host's speed moves
    # between rounds, so these ratios are steadier than a ratio of medians.
    print()
    print("| variant | × no limiter, round by round | median of the rounds |")
    print("|---|---|---:|")
    for v in order[1:]:
        rs = per_round(v)
        print(f"| {names[v]} | " + ", ".join(f"{r:.2f}" for r in rs) + f" | {med(rs):.2f}× |")
    # Like for like, each round against a variant that does the same kind of
    # work: the headers' bytes on both sides; no headers on either side.
    for v, against, label in [
            ("memory", "none-headers", "the no-limiter app sending four constant headers"),
            ("memory-bare", "governor", "tower_governor (neither sends headers)"),
            ("redis-bare", "multiplexed", "the multiplexed EVALSHA limiter (neither sends headers)"),
            ("redis", "rival-redis", "tower-rate-limiter's Redis")] + [
            (v, v + "@base", "the baseline revision") for v in known] + [
            ("redis-tls", "redis", "itself over plain TCP"),
            ("redis-tls-bare", "redis-bare", "itself over plain TCP")]:
        rs = per_round(v, against)
        if rs:
            print(f"| {names[v]}, against {label} | "
                  + ", ".join(f"{r:.2f}" for r in rs) + f" | {med(rs):.2f}× |")
rates = sorted(fix, reverse=True)
OVERLOADED = float("inf")
def added_p99(v, r):
    """V's p99 over no limiter's at rate R in ms, OVERLOADED when V could not
    keep up (its latencies are then queueing, not the limiter's), None when
    either did not run."""
    fx = fix[r].get(v)
    if not fx:
        return None
    if med([x[3] / x[4] for x in fx]) < 0.97 or sum(x[2] for x in fx):
        return OVERLOADED
    if "none" not in fix[r]:
        return None
    return (med([x[1] for x in fx]) - med([x[1] for x in fix[r]["none"]])) / 1000
if rates:
    print()
    print("| variant | " + " | ".join(f"{r:,} req/s: p50 / p99 / added p99" for r in rates) + " |")
    print("|---|" + "---:|" * len(rates))
    for v in order:
        cells = []
        for r in rates:
            fx = fix[r].get(v, [])
            if not fx:
                cells.append("-")
                continue
            added = added_p99(v, r)
            if added == OVERLOADED:
                cells.append("overloaded")
                continue
            p50, p99 = med([x[0] for x in fx]), med([x[1] for x in fx])
            added = f"{added:+.2f} ms" if added is not None and v != "none" else "-"
            cells.append(f"{p50 / 1000:.2f} / {p99 / 1000:.2f} ms / {added}")
        print(f"| {names[v]} | " + " | ".join(cells) + " |")
print()  # a table ends at a blank line
if os.environ.get("RIVAL_MISSING"):
    print(f"tower-rate-limiter 0.1.6 (rival, rival-redis): rows absent, {os.environ['RIVAL_MISSING']}.")
for label, reqs, non2xx, cmds in ham:
    print(f"Hammering client, {label}: {int(reqs)} requests, {int(non2xx)} rejected, "
          f"{int(cmds)} Redis commands ({cmds / max(non2xx, 1):.4f} per rejected request).")
for conns, reqs, failures in fo:
    print(f"Saturated Redis variant at {conns} connections: {failures} of {reqs} decisions made without the store.")

# The performance targets, each from what this run measured. A variant that did not
# run leaves its target out; every measured variant must meet a target for
# "met", and "met ... only" names those that do when only some do. Values
# are judged as printed (rounded to the digits shown).
def ratio(v, against="none"):
    rs = per_round(v, against)
    return med(rs) if rs else None
def verdict(values, ok):
    good = [label for label, x in values if ok(x)]
    if len(good) == len(values):
        return "met"
    return f"met {' and '.join(good)} only" if good else "missed"
def target(name, values, ok, show):
    values = [(label, x) for label, x in values if x is not None]
    if values:
        shown = "; ".join(f"{label} {show(x)}" for label, x in values)
        targets.append((name, shown, verdict(values, ok)))
targets = []
both = lambda with_h, without: [("with headers", with_h), ("without headers", without)]
target("memory store ≥ 0.97× of no limiter", both(ratio("memory"), ratio("memory-bare")),
       lambda x: round(x, 2) >= 0.97, lambda x: f"{x:.2f}×")
target("memory store not below tower_governor (neither sending headers)",
       [("without headers", ratio("memory-bare", "governor"))],
       lambda x: round(x, 2) >= 1.0, lambda x: f"{x:.2f}× of tower_governor")
target("Redis store ≥ 0.7× of no limiter", both(ratio("redis"), ratio("redis-bare")),
       lambda x: round(x, 2) >= 0.7, lambda x: f"{x:.2f}×")
target("Redis store ≥ 1.2× tower-rate-limiter's Redis store",
       [("both with headers", ratio("redis", "rival-redis"))],
       lambda x: round(x, 2) >= 1.2, lambda x: f"{x:.2f}× of tower-rate-limiter")
redis_med = lambda v, i: med([x[i] for x in sat[v]]) if v in sat else None
target("≤ 6 µs of Redis CPU per decision", both(redis_med("redis", 5), redis_med("redis-bare", 5)),
       lambda x: round(x, 1) <= 6, lambda x: f"{x:.1f} µs")
half = [r for r in rates if base and abs(r - base / 2) <= base * 0.01]
at_half = lambda v: added_p99(v, half[0]) if half and "none" in fix[half[0]] else None
target(f"≤ 0.5 ms added p99 at half load ({half[0]:,} req/s)" if half else "≤ 0.5 ms added p99 at half load",
       both(at_half("redis"), at_half("redis-bare")), lambda x: round(x, 2) <= 0.5,
       lambda x: "overloaded" if x == OVERLOADED else f"{x:+.2f} ms")
target("≤ 1 Redis command per request", both(redis_med("redis", 4), redis_med("redis-bare", 4)),
       lambda x: round(x, 2) <= 1, lambda x: f"{x:.2f}")
on = [cmds / max(non2xx, 1) for label, reqs, non2xx, cmds in ham if label == "deny cache on"]
target("hammering client, deny cache on: Redis commands per rejection near 0 (below 0.001)",
       [("measured", on[0] if on else None)], lambda x: x < 0.001, lambda x: f"{x:.4f}")
target("saturated, with a healthy Redis: no decision fails open, at 64 and 2,000 connections",
       [(f"{conns} connections", failures) for conns, reqs, failures in fo], lambda x: x == 0, str)
if targets:
    print("\nThe targets, from this run (ratios are medians of each round against its own baseline):\n")
    print("| target | measured | verdict |")
    print("|---|---|---|")
    for name, shown, result in targets:
        print(f"| {name} | {shown} | {result} |")
