#!/usr/bin/env bash
# The layer's own cost in the application, counted in instructions per
# request with callgrind: about the same count on every run, whatever else
# the machine is doing (criterion's nanoseconds and scripts/bench.sh's
# throughput swing by ±10-20% on a shared VM). Compares the working tree with
# another revision, side by side.
#
#   scripts/layer_cost.sh            # working tree vs HEAD
#   scripts/layer_cost.sh 2b8672a    # working tree vs a tag or commit
#
# For each tree it builds tools/src/bin/layer_cost.rs (the working tree's copy,
# so both run the same driver) and counts what one request through the layer
# costs (memory store, one hot key, a no-op service answering as axum's hello
# world does): the difference between 2 000 and 10 000 requests, divided by
# 8 000, so start-up is left out. Rows: the service alone (the baseline the
# layer adds to), the layer without rate-limit headers, GitHub headers
# with a limit of 10^9 (numbers of full length, as in scripts/bench.sh) and of
# 9 999 (shorter numbers), and the IETF headers.
#
# Needs valgrind (installed with apt when missing). The first run builds the
# other revision in target/layer-cost (a few minutes); later runs reuse it.
set -euo pipefail
shopt -s inherit_errexit # a failing step inside $(...) stops the script too

cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
REV=$(revision "${1:-}")
install_missing valgrind valgrind

ROOT=$PWD
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
TREE=$(mktemp -d)
cleanup() {
  git -C "$ROOT" worktree remove --force "$TREE" 2>/dev/null || rm -rf "$TREE"
  rm -f "$TREE.here" "$TREE.there"
}
trap cleanup EXIT

cargo build --quiet --release -p tower-ratelimit-tools --bin layer_cost
cp "$CARGO_TARGET_DIR/release/layer_cost" "$TREE.here"

build_at "$REV" "$TREE" layer_cost "$ROOT/target/layer-cost" --features redis
cp "$BUILT" "$TREE.there"

# Instructions callgrind counts for one run of BIN with ARGS.
instructions() {
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$@" 2>&1 >/dev/null |
    awk '/Collected/ {print $4}'
}

# Instructions per request of BIN for STYLE and LIMIT.
per_request() { # bin style limit
  local few many
  few=$(instructions "$1" "$2" "$3" 2000)
  many=$(instructions "$1" "$2" "$3" 10000)
  echo $(((many - few) / 8000))
}

printf '| instructions per request | %s | working tree | change |\n|---|---:|---:|---:|\n' "$REV"
for row in "off 1 the service alone, no layer" \
  "none 1000000000 no rate-limit headers" \
  "github 1000000000 GitHub headers, limit 10^9" \
  "github 9999 GitHub headers, limit 9 999" \
  "ietf 9999 IETF headers, limit 9 999"; do
  read -r style limit label <<<"$row"
  there=$(per_request "$TREE.there" "$style" "$limit")
  here=$(per_request "$TREE.here" "$style" "$limit")
  printf '| %s | %d | %d | %+.1f%% |\n' "$label" "$there" "$here" \
    "$(awk -v a="$there" -v b="$here" 'BEGIN {print (b - a) * 100 / a}')"
done
