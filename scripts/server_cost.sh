#!/usr/bin/env bash
# What each variant of scripts/bench.sh costs the whole server per request,
# counted in instructions with callgrind: the axum app, hyper, tokio and the
# limiter together, as wrk drives them (64 connections). Unlike throughput on
# a shared VM, which swings by ±10-20% between rounds, these counts repeat
# within about 1% from run to run (the Redis variant too, though how many
# requests share a script call depends on timing). They leave out the kernel
# (a system call counts as one instruction), which for this hello world is
# about twice the user-space count (docs/performance.md, "The whole server, in
# instructions"), so a ratio here is a bound the throughput ratio stays
# above, not a prediction of it.
#
#   scripts/server_cost.sh              # every variant, working tree
#   scripts/server_cost.sh 2b8672a      # beside a tag or commit, side by side
#   VARIANTS="none memory" scripts/server_cost.sh
#
# Per variant it starts tools/src/bin/bench_server.rs under callgrind (one tokio
# worker), warms it up with wrk for 2 s, zeroes the counters, drives it for
# 4 s more, dumps them, and divides by the requests wrk completed (requests
# still in flight when wrk stops add up to 64 to the count's numerator: under
# half a percent). The other revision is built in a git worktree, into
# target/server-cost, with the working tree's bench_server.rs, so both run
# the same variants (a first run takes several minutes to build it).
#
# Needs valgrind, wrk and redis-server (installed with apt when missing).
set -euo pipefail
shopt -s inherit_errexit # a failing step inside $(...) stops the script too

cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
REV=""
[ -n "${1:-}" ] && REV=$(revision "$1")
VARIANTS=${VARIANTS:-"none none-headers governor governor-headers memory memory-bare redis redis-bare multiplexed"}

install_missing "valgrind wrk redis-server" valgrind wrk redis-server redis-cli

ROOT=$PWD
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
WORK=$(mktemp -d)
# Every process started, one PID a line: per_request runs in a subshell
# ($(...)), so an array would not reach cleanup.
PIDS=$WORK/pids
touch "$PIDS"
cleanup() {
  while read -r p; do kill "$p" 2>/dev/null || true; done <"$PIDS"
  wait 2>/dev/null || true
  if [ -n "$REV" ]; then
    git -C "$ROOT" worktree remove --force "$WORK/tree" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

cargo build --quiet --release -p tower-ratelimit-tools --bin bench_server
cp "$CARGO_TARGET_DIR/release/bench_server" "$WORK/here"
if [ -n "$REV" ]; then
  build_at "$REV" "$WORK/tree" bench_server "$ROOT/target/server-cost" --features redis
  cp "$BUILT" "$WORK/there"
fi

RPORT=$(free_port)
redis-server --port "$RPORT" --bind 127.0.0.1 --save "" --appendonly no >"$WORK/redis.log" 2>&1 &
echo "$!" >>"$PIDS"
wait_for_redis "$RPORT" "$WORK/redis.log"

# Instructions per request of BIN serving VARIANT.
per_request() { # bin variant
  local port log out vp n total
  port=$(free_port)
  log=$WORK/$2.log
  out=$WORK/$2.cg
  # A long store timeout: callgrind slows the app twenty-fold, and a charge
  # that timed out would measure the failure path instead.
  valgrind --tool=callgrind --callgrind-out-file="$out" "$1" --variant "$2" --workers 1 \
    --listen "127.0.0.1:$port" --redis-url "redis://127.0.0.1:$RPORT" \
    --store-timeout-ms 10000 >"$log" 2>&1 &
  vp=$!
  echo "$vp" >>"$PIDS"
  # Up to 60 s: valgrind starts slowly when the host is busy.
  for _ in $(seq 600); do
    grep -q '^listening on' "$log" && break
    kill -0 "$vp" 2>/dev/null || break
    sleep 0.1
  done
  grep -q '^listening on' "$log" || {
    echo "bench_server --variant $2 did not start under valgrind:" >&2
    cat "$log" >&2
    exit 1
  }
  wrk -t1 -c64 -d2s "http://127.0.0.1:$port/" >/dev/null
  callgrind_control --zero "$vp" >/dev/null 2>&1
  wrk -t1 -c64 -d4s "http://127.0.0.1:$port/" >"$WORK/wrk.txt"
  callgrind_control --dump "$vp" >/dev/null 2>&1
  n=$(awk '/requests in/ {print $1}' "$WORK/wrk.txt")
  if [ -z "$n" ] || [ "$n" -eq 0 ] || grep -qE 'Non-2xx|Socket errors' "$WORK/wrk.txt"; then
    echo "bench_server --variant $2: wrk did not get only successful responses:" >&2
    cat "$WORK/wrk.txt" >&2
    exit 1
  fi
  kill "$vp"
  wait "$vp" 2>/dev/null || true
  # The dump ($out.1) holds the counts since the zeroing.
  total=$(awk '/^(summary|totals):/ {print $2; exit}' "$out.1")
  rm -f "$out"*
  echo $((total / n))
}

declare -A HERE THERE
for v in $VARIANTS; do
  HERE[$v]=$(per_request "$WORK/here" "$v")
  [ -n "$REV" ] && THERE[$v]=$(per_request "$WORK/there" "$v")
  echo "$v: ${HERE[$v]}${REV:+ (at $REV: ${THERE[$v]})}" >&2
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f×", b / a}'; }
if [ -n "$REV" ]; then
  printf '| variant | %s | working tree | change | × none (working tree) |\n|---|---:|---:|---:|---:|\n' "$REV"
else
  printf '| variant | instructions per request | × none (none / variant) |\n|---|---:|---:|\n'
fi
for v in $VARIANTS; do
  rel="-"
  [ -n "${HERE[none]:-}" ] && rel=$(ratio "${HERE[$v]}" "${HERE[none]}")
  if [ -n "$REV" ]; then
    printf '| %s | %d | %d | %+.1f%% | %s |\n' "$v" "${THERE[$v]}" "${HERE[$v]}" \
      "$(awk -v a="${THERE[$v]}" -v b="${HERE[$v]}" 'BEGIN {print (b - a) * 100 / a}')" "$rel"
  else
    printf '| %s | %d | %s |\n' "$v" "${HERE[$v]}" "$rel"
  fi
done
