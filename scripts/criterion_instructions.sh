#!/usr/bin/env bash
# The criterion decision costs (benches/memory.rs) in instructions per
# decision, for the working tree beside another revision: callgrind counts
# about the same number on every run, where criterion's nanoseconds swing
# by 20% or more on a shared VM (even for code that did not change).
#
#   BASE_REV=8f1b784 scripts/criterion_instructions.sh
#
# Each benchmark runs for one second under callgrind (criterion's
# --profile-time); the figure is the instructions of the function one
# iteration calls (a store's charge for the store rows, the whole request
# for the layer rows), inclusive, divided by the number of calls. Needs
# valgrind (installed with apt when missing).
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
install_missing valgrind valgrind

BASE_REV=$(revision "${BASE_REV:-}")
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
WORK=$(mktemp -d)
# The worktree is gone unless the script stopped while building it.
trap 'git worktree remove --force "$WORK/base" 2>/dev/null || true; rm -rf "$WORK"' EXIT
bench_pair "$BASE_REV" "$WORK"

STORE='<tower_ratelimit::store::memory::MemoryStore as tower_ratelimit::store::Store>::charge'
LAYER='memory::one_request'

# Instructions per call of FUNCTION while BINARY runs BENCH.
per_call() { # binary bench function
  local out="$WORK/callgrind.out"
  valgrind --tool=callgrind --callgrind-out-file="$out" "$1" --bench --profile-time 1 "$2" >/dev/null 2>&1
  callgrind_annotate --tree=calling --inclusive=yes "$out" 2>/dev/null |
    awk -v f="$3" '
      index($0, "> ") && index($0, f " (") {
        n = $1; gsub(",", "", n)
        c = $0; sub(/.* \(/, "", c); sub(/x\).*/, "", c); gsub(",", "", c)
        if (c + 0 > best) { best = c + 0; total = n + 0 }
      }
      END { if (best) printf "%d", total / best; else printf "-" }'
}

printf '| bench | %s | this tree | change |\n|---|---:|---:|---:|\n' "$BASE_REV"
for row in \
  "store/hot key/memory fixed window|$STORE" \
  "store/algorithm, hot key/fw|$STORE" \
  "store/algorithm, hot key/tb|$STORE" \
  "store/algorithm, hot key/gc|$STORE" \
  "store/algorithm, hot key/sw|$STORE" \
  "store/algorithm, hot key/sl|$STORE" \
  "store/100k keys/memory fixed window|$STORE" \
  "layer/hot key/no limiter|$LAYER" \
  "layer/hot key/tower-ratelimit/memory, github headers|$LAYER" \
  "layer/hot key/tower-ratelimit/memory, no headers|$LAYER" \
  "layer/5000 per s/tower-ratelimit/memory, github headers|$LAYER" \
  "layer/5000 per s/tower-ratelimit/memory, no headers|$LAYER"; do
  bench=${row%%|*}
  function=${row#*|}
  there=$(per_call "$BENCH_BASE" "$bench" "$function")
  here=$(per_call "$BENCH_HEAD" "$bench" "$function")
  change=$(awk -v a="$there" -v b="$here" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%+.1f%%", (b - a) * 100 / a; else print "-" }')
  printf '| %s | %s | %s | %s |\n' "$bench" "$there" "$here" "$change"
done
