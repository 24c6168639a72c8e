#!/usr/bin/env bash
# The criterion decision costs (benches/memory.rs) of the working tree beside
# another revision's, interleaved: each round runs the base's benchmarks,
# then this tree's, so a host whose speed drifts affects both alike. Prints,
# per benchmark, both medians, every round's ratio (this tree / base) and
# their median.
#
#   BASE_REV=main~3 scripts/criterion_compare.sh               # everything
#   BASE_REV=main~3 ROUNDS=6 SECS=3 scripts/criterion_compare.sh 'layer/'
#
# The argument is criterion's filter (a regular expression on benchmark
# names). Each revision builds its own benches/memory.rs, so the two measure
# the same code only where the benchmark file is unchanged between them.
# Even then two binaries of identical code can differ by 20% or more here
# (code placement): read a benchmark's ratio beside that of a benchmark
# whose code did not change (governor's, tower_governor's, no limiter).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

FILTER=${1:-}
ROUNDS=${ROUNDS:-3}
SECS=${SECS:-2}
BASE_REV=$(revision "${BASE_REV:-}")
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
WORK=$(mktemp -d)
# The worktree is gone unless the script stopped while building it.
trap 'git worktree remove --force "$WORK/base" 2>/dev/null || true; rm -rf "$WORK"' EXIT
bench_pair "$BASE_REV" "$WORK"

run() { # binary round
  "$1" --bench --warm-up-time 1 --measurement-time "$SECS" "$FILTER" 2>/dev/null >"$WORK/$2"
}
for r in $(seq "$ROUNDS"); do
  echo "criterion_compare.sh: round $r of $ROUNDS" >&2
  run "$BENCH_BASE" "base.$r"
  run "$BENCH_HEAD" "head.$r"
done

python3 - "$WORK" "$ROUNDS" "$BASE_REV" <<'EOF'
import re, statistics, sys
work, rounds, base_rev = sys.argv[1], int(sys.argv[2]), sys.argv[3]
UNITS = {"ps": 0.001, "ns": 1, "µs": 1000, "us": 1000, "ms": 1e6}

def medians(path):
    out, name = {}, None
    for line in open(path):
        if re.match(r"^(store|layer)/", line):
            name = re.split(r"\s{2,}", line.strip())[0]
        m = re.search(r"time:\s+\[\S+ \S+ (\S+) (\S+) \S+ \S+\]", line)
        if m and name:
            out[name] = float(m.group(1)) * UNITS[m.group(2)]
            name = None
    return out

runs = [(medians(f"{work}/base.{r}"), medians(f"{work}/head.{r}")) for r in range(1, rounds + 1)]
print(f"| bench | {base_rev} | this tree | ratio per round | median ratio |")
print("|---|---:|---:|---|---:|")
for name in runs[0][0]:
    pairs = [(b[name], h[name]) for b, h in runs if name in b and name in h]
    if not pairs:
        continue
    ratios = [h / b for b, h in pairs]
    b = statistics.median(p[0] for p in pairs)
    h = statistics.median(p[1] for p in pairs)
    each = " ".join(f"{x:.2f}" for x in ratios)
    print(f"| {name} | {b:.1f} ns | {h:.1f} ns | {each} | {statistics.median(ratios):.2f}× |")
EOF
