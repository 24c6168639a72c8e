#!/usr/bin/env bash
# The instruction budget: what one request through the rate-limit layer costs
# the application, counted in instructions with callgrind (the same count on
# every run, whatever else the machine is doing), beside the budget in
# benches/instructions.budget.
#
#   scripts/instructions.sh            # print each case's count beside its budget
#   scripts/instructions.sh --check    # the same; fail when a case is more than 3% above its budget
#   scripts/instructions.sh --update   # write the counts into benches/instructions.budget
#
# Cases (tools/src/bin/layer_cost.rs drives them: one hot key, a quota of
# 10^9 an hour, a no-op service answering as axum's hello world does):
#   memory-headers  the memory store, GitHub-style headers (the default)
#   memory-bare     the memory store, no rate-limit headers
#   redis-bare      the Redis store, no rate-limit headers: a redis-server
#                   started here on a free port, requests sent in waves of 32
#                   at once, so each pays its share of one script call; every
#                   thread of the application counts, its Redis I/O thread too
# Each count is the difference between a run of FEW and a run of MANY
# requests, divided by MANY - FEW, so start-up (connecting, loading the
# script) is left out; the service alone, counted the same way, is
# subtracted: what remains is the layer's own cost.
#
# Needs valgrind and redis-server (installed with apt when missing). It builds
# the tool in release (reusing target/), then counts for under a minute.
set -euo pipefail
shopt -s inherit_errexit # a failing step inside $(...) stops the script too

cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

MODE=${1:-}
case $MODE in
  "" | --check | --update) ;;
  *)
    echo "usage: scripts/instructions.sh [--check | --update]" >&2
    exit 2
    ;;
esac
BUDGET=benches/instructions.budget
# Percent above its budget a case may measure before --check fails.
TOLERANCE=3
LIMIT=1000000000
BATCH=32

install_missing "valgrind redis-server" valgrind redis-server redis-cli

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --quiet --release -p tower-ratelimit-tools --bin layer_cost
BIN=$CARGO_TARGET_DIR/release/layer_cost

WORK=$(mktemp -d)
RPID=""
cleanup() {
  if [ -n "$RPID" ]; then
    kill "$RPID" 2>/dev/null || true
    wait "$RPID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

RPORT=$(free_port)
redis-server --port "$RPORT" --bind 127.0.0.1 --save "" --appendonly no >"$WORK/redis.log" 2>&1 &
RPID=$!
wait_for_redis "$RPORT" "$WORK/redis.log"
REDIS=(redis://127.0.0.1:"$RPORT" "$BATCH")

# Instructions callgrind counts for one run of layer_cost with ARGS.
count() {
  local log=$WORK/callgrind.log n
  if ! valgrind --tool=callgrind --callgrind-out-file=/dev/null "$BIN" "$@" >/dev/null 2>"$log"; then
    echo "instructions.sh: layer_cost $* failed:" >&2
    grep -v '^==' "$log" >&2
    exit 1
  fi
  n=$(awk '/Collected/ {print $4}' "$log")
  [[ $n =~ ^[0-9]+$ ]] || {
    echo "instructions.sh: callgrind counted nothing for layer_cost $*" >&2
    exit 1
  }
  echo "$n"
}

# The mean of REPEAT counts of layer_cost with ARGS.
mean() { # repeat args...
  local repeat=$1 i
  shift
  for i in $(seq "$repeat"); do count "$@"; done | awk '{s += $1} END {printf "%d", s / NR}'
}

# Instructions per request of STYLE: (MANY requests - FEW requests) / (MANY - FEW),
# each count the mean of REPEAT runs.
per_request() { # repeat style few many [redis-url batch]
  local repeat=$1 style=$2 few=$3 many=$4 a b
  shift 4
  a=$(mean "$repeat" "$style" "$LIMIT" "$few" "$@")
  b=$(mean "$repeat" "$style" "$LIMIT" "$many" "$@")
  echo $(((b - a) / (many - few)))
}

# The layer's own cost per request in CASE. The memory store's counts repeat
# exactly. With Redis, how the application's two threads happen to take
# turns moves the allocator's work by up to 1% from run to run, so its
# counts are means of sixteen runs (which agree within a few tenths of a
# percent).
measure() { # case
  local layer alone
  case $1 in
    memory-headers)
      layer=$(per_request 1 github 2000 10000)
      alone=$(per_request 1 off 2000 10000)
      ;;
    memory-bare)
      layer=$(per_request 1 none 2000 10000)
      alone=$(per_request 1 off 2000 10000)
      ;;
    redis-bare)
      layer=$(per_request 16 none 256 10240 "${REDIS[@]}")
      alone=$(per_request 1 off 256 10240 "${REDIS[@]}")
      ;;
  esac
  echo $((layer - alone))
}

# What a new line of the budget file says about CASE.
describe() { # case
  case $1 in
    memory-headers) echo "memory store, GitHub-style headers (the default)" ;;
    memory-bare) echo "memory store, no rate-limit headers" ;;
    redis-bare) echo "Redis store, no rate-limit headers, waves of $BATCH requests a script call" ;;
  esac
}

CASES="memory-headers memory-bare redis-bare"
declare -A MEASURED
for c in $CASES; do MEASURED[$c]=$(measure "$c"); done

if [ "$MODE" = --update ]; then
  [ -f "$BUDGET" ] || printf '# Instructions per request the rate-limit layer may cost (scripts/instructions.sh).\n' >"$BUDGET"
  for c in $CASES; do
    if grep -q "^$c " "$BUDGET"; then
      sed -i -E "s/^($c )[0-9]+/\\1${MEASURED[$c]}/" "$BUDGET"
    else
      printf '%s %s # %s\n' "$c" "${MEASURED[$c]}" "$(describe "$c")" >>"$BUDGET"
    fi
  done
  echo "instruction budget: wrote $BUDGET"
fi

printf 'instruction budget: instructions per request, the layer'"'"'s own (a case more than %s%% above its budget fails)\n' "$TOLERANCE"
printf '%-16s %10s %10s %7s\n' case measured budget ratio
over=()
for c in $CASES; do
  budget=$(awk -v c="$c" '$1 == c {print $2}' "$BUDGET" 2>/dev/null || true)
  if [ -z "$budget" ]; then
    printf '%-16s %10d %10s %7s  no budget\n' "$c" "${MEASURED[$c]}" - -
    over+=("$c")
    continue
  fi
  ratio=$(awk -v m="${MEASURED[$c]}" -v b="$budget" 'BEGIN {printf "%.3f", m / b}')
  verdict=ok
  if awk -v m="${MEASURED[$c]}" -v b="$budget" -v t="$TOLERANCE" 'BEGIN {exit !(m * 100 > b * (100 + t))}'; then
    verdict="over budget"
    over+=("$c")
  elif awk -v m="${MEASURED[$c]}" -v b="$budget" -v t="$TOLERANCE" 'BEGIN {exit !(m * 100 < b * (100 - t))}'; then
    verdict="below budget: --update keeps the gain"
  fi
  printf '%-16s %10d %10d %7s  %s\n' "$c" "${MEASURED[$c]}" "$budget" "$ratio" "$verdict"
done

if [ "${#over[@]}" -eq 0 ]; then
  echo "instruction budget: no case more than $TOLERANCE% above $BUDGET"
  exit 0
fi
echo "instruction budget: ${over[*]} over budget (more than $TOLERANCE% above $BUDGET, or not in it)."
echo "instruction budget: find what made a request dearer or, if the cost is worth it,"
echo "instruction budget: run scripts/instructions.sh --update and say why in the commit."
if [ "$MODE" = --check ]; then exit 1; fi
