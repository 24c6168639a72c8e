#!/usr/bin/env bash
# Redis CPU of the charge script, counted in instructions per decision with
# callgrind: about the same count on every run, whatever else the machine is
# doing (CPU steal makes the microsecond figures of benches/redis.rs and
# scripts/bench.sh swing by ±20% on a shared VM). Compares the working tree's
# lua/ with another revision's, side by side.
#
#   scripts/script_cost.sh            # working tree vs HEAD
#   scripts/script_cost.sh v0.3.0     # working tree vs a tag or commit
#
# For each tree it assembles the charge script as src/store/redis/scripts.rs
# does for a policy of one quota of each algorithm but the sliding log (for
# the rate algorithms 100 a second, burst 100), starts redis-server under
# valgrind on a free port, loads the script, warms 200 keys up, then counts
# the instructions
# redis-server runs for `redis-benchmark` sending batches of 1, 15 and 32
# requests per EVALSHA (15 is what one call carried under load in
# scripts/bench.sh), over random keys, and batches of 15 for one hot key
# (a global limit, one busy client; limits too high to reject). Everything Redis does per call is included: reading the
# command, the script, its HMGET/HSET/HINCRBY, the reply. The keys are drawn
# at random, so counts move by a few tenths of a percent between runs.
#
# Needs valgrind, redis-server, redis-cli and redis-benchmark (installed
# with apt when missing). Takes about three minutes.
set -euo pipefail
shopt -s inherit_errexit # a failing step inside $(...) stops the script too

cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
REV=$(revision "${1:-}")

install_missing "valgrind redis-server redis-tools" valgrind redis-server redis-benchmark

WORK=$(mktemp -d)
SRV=""
cleanup() {
  if [ -n "$SRV" ]; then kill "$SRV" 2>/dev/null || true; fi
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# lua FILE from the working tree (TREE=.) or from revision TREE.
lua() {
  if [ "$1" = . ]; then cat "lua/$2.lua"; else git show "$1:lua/$2.lua"; fi
}

# The charge script for one algorithm, as src/store/redis/scripts.rs assembles it.
assemble() { # tree algorithm-file
  lua "$1" prelude
  case $2 in token_bucket | gcra) lua "$1" rate ;; esac
  lua "$1" "$2"
  lua "$1" policy
  lua "$1" charge
}

NOW=$(($(date +%s) * 1000))
# The policy's arguments (lua/policy.lua): n = 1, then code, field prefix, a, b, c.
policy_args() {
  # One hot key: limits no request reaches.
  if [ "${2:-}" = hot ]; then
    case $1 in
      fixed_window) echo "1 fw fw3600000 1000000000000 3600000 0" ;;
      token_bucket) echo "1 tb tb1000 1 1000000 1000000000000" ;;
      gcra) echo "1 gc gc1000 1 1000000 1000000000000" ;;
      sliding_window) echo "1 sw sw60000 1000000000000 60000 0" ;;
    esac
    return
  fi
  case $1 in
    fixed_window) echo "1 fw fw3600000 1000000000 3600000 0" ;;
    # 100 a second, burst 100 (unit 10, 1 fine unit a ms, capacity 1,000):
    # each of the 200 keys gets under 100 charges, all admitted.
    token_bucket) echo "1 tb tb1000 10 1 1000" ;;
    gcra) echo "1 gc gc1000 10 1 1000" ;;
    sliding_window) echo "1 sw sw60000 1000 60000 0" ;;
  esac
}

# Instructions redis-server runs per decision (tree, algorithm, requests per
# call), into COUNT. Not called in $(...): the server's PID must reach cleanup.
count() {
  local tree=$1 alg=$2 per=${3%h} hot=${3//[0-9]/} port out sha calls i total key='rb:{__rand_int__}'
  port=$(free_port)
  out=$WORK/cg.out
  rm -f "$out"*
  valgrind --tool=callgrind --callgrind-out-file="$out" \
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    >/dev/null 2>&1 &
  SRV=$!
  for i in $(seq 301); do
    [ "$(redis-cli -p "$port" PING 2>/dev/null)" = PONG ] && break
    [ "$i" = 301 ] && { echo "script_cost.sh: redis-server did not start" >&2; exit 1; }
    sleep 0.1
  done
  sha=$(assemble "$tree" "$alg" | redis-cli -p "$port" -x SCRIPT LOAD)
  [[ $sha =~ ^[0-9a-f]{40}$ ]] || { echo "script_cost.sh: SCRIPT LOAD: $sha" >&2; exit 1; }
  # lua/charge.lua: keys, then P = 1, the policy, J, then per request:
  # policy index, time, cost (and, in trees whose quotas carry a mode, the
  # reservation: the quota counts requests, mode 0).
  local args=() keys=() more=()
  local policy next=1
  if [ -n "$hot" ]; then
    key="rb:{hot}"
    policy=$(policy_args "$alg" hot)
    # As the application sends a run of one key, if this tree's script
    # takes runs: the key once, then policy 0 ("continues the run").
    if lua "$tree" charge | grep -q "== '0'"; then next=0; fi
  else
    policy=$(policy_args "$alg")
  fi
  if lua "$tree" policy | grep -q "m = tonumber"; then
    policy="$policy 0"
    more=(1)
  fi
  for i in $(seq "$per"); do
    if [ "$i" = 1 ] || [ "$next" = 1 ]; then
      keys+=("$key")
      args+=(1 "$NOW" 1 "${more[@]}")
    else
      args+=(0 "$NOW" 1 "${more[@]}")
    fi
  done
  # shellcheck disable=SC2086
  set -- EVALSHA "$sha" "${#keys[@]}" "${keys[@]}" 1 $policy "$per" "${args[@]}"
  calls=$((9600 / per))
  # Warm-up: about 800 charges, so nearly all 200 keys exist (multiples of -P 4).
  redis-benchmark -p "$port" -q -n $(((800 / per + 3) / 4 * 4)) -r 200 -c 1 -P 4 "$@" >/dev/null
  callgrind_control -z "$SRV" >/dev/null 2>&1
  redis-benchmark -p "$port" -q -n "$calls" -r 200 -c 1 -P 4 "$@" >/dev/null
  callgrind_control -d "$SRV" >/dev/null 2>&1
  redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
  wait "$SRV" 2>/dev/null || true
  SRV=""
  total=$(awk '/^(summary|totals):/ {t = $2} END {print t}' "$out.1")
  [ -n "$total" ] || { echo "script_cost.sh: no callgrind dump in $out.1" >&2; exit 1; }
  COUNT=$(awk -v t="$total" -v d=$((calls * per)) 'BEGIN {printf "%.0f", t / d}')
}

printf '| script | requests per call | %s | working tree | change |\n|---|---:|---:|---:|---:|\n' "$REV"
for alg in fixed_window token_bucket gcra sliding_window; do
  for per in 1 15 32 15h; do
    count "$REV" "$alg" "$per"
    old=$COUNT
    count . "$alg" "$per"
    new=$COUNT
    printf '| charge.lua, %s | %s | %s | %s | %+.1f%% |\n' "$alg" "${per/h/, one key}" "$old" "$new" \
      "$(awk -v a="$old" -v b="$new" 'BEGIN {print (b - a) * 100 / a}')"
  done
done
echo
echo "Instructions redis-server runs per decision (callgrind), batches sent by redis-benchmark -P 4 over 200 keys (\"one key\": every request of the batch for one key)."
