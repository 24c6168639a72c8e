#!/usr/bin/env bash
# End-to-end benchmark: the axum hello world with no limiter (and
# with no limiter but four constant rate-limit headers, what their bytes cost
# by themselves), with tower_governor (without and with its rate-limit headers), with this crate
# on memory and on Redis (each with and without headers), and with two
# hand-written Redis limiters (one EVALSHA per request on a shared multiplexed
# connection; on a connection checked out of a deadpool pool), and with the
# closest rival, the crate tower-rate-limiter on memory and on Redis
# (tools/rival, built with `cargo +nightly` when there is a nightly toolchain:
# it needs a newer Rust than the stable one; without it its rows are absent),
# side by side, interleaved over rounds.
#
#   scripts/bench.sh                      # ~18 minutes with the defaults
#   ROUNDS=2 SECS=5 FIXED_SECS=5 scripts/bench.sh   # ~7 minutes
#
# The app runs with one tokio worker pinned to CPU $APP_CPU; wrk, the open-loop
# load generator (tools/src/bin/loadgen.rs) and redis-server share CPU $LOAD_CPU.
# Per variant and round it records wrk's throughput and p50/p99, the app's CPU
# per request, in user and kernel time (/proc/PID/stat utime, stime), Redis round trips per request
# (INFO commandstats: EVALSHA, EVAL, PING, UNWATCH, SCRIPT, EXEC — what clients send;
# commands run inside scripts are not round trips, and a MULTI … EXEC pipeline,
# tower-rate-limiter's, is one) and Redis CPU per request
# (INFO cpu). Then fixed-rate runs at half and a quarter of the no-limiter
# throughput (FIXED_FRACTIONS) report the latency each limiter adds when not
# saturated, and (when VARIANTS has redis or redis-bare) a hammering client
# (everything rejected) shows Redis commands per rejection with and without
# the deny cache. Prints Markdown tables of medians, with ratios to the
# no-limiter baseline of the same run, and of each round to its own baseline,
# then each of the targets in docs/performance.md with what this run measured for it and
# whether it was met (a target whose variants did not run is left out).
# .ci/run runs it once, short, to show it still runs and reports every target.
# The report is scripts/bench_report.py (checked by scripts/bench_report_test.py).
set -euo pipefail

ROUNDS=${ROUNDS:-3}
SECS=${SECS:-10}
FIXED_SECS=${FIXED_SECS:-8}
CONNS=${CONNS:-64}
VARIANTS=${VARIANTS:-"none none-headers governor governor-headers memory memory-bare redis redis-bare multiplexed naive rival rival-redis"}
APP_CPU=${APP_CPU:-0}
# Environment assignments for every app variant alike, e.g.
# APP_ENV=GLIBC_TUNABLES=glibc.malloc.tcache_count=256 (see the README's
# Redis capacity arithmetic).
APP_ENV=${APP_ENV:-}
# One core: everything shares it (a smoke run, not a measurement).
LOAD_CPU=${LOAD_CPU:-$(($(nproc) > 1 ? 1 : 0))}

cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
BIN=$CARGO_TARGET_DIR/release

# shellcheck source=scripts/lib.sh
. scripts/lib.sh
install_missing "wrk redis-server openssl curl" wrk redis-server redis-cli openssl curl

cargo build --quiet --release -p tower-ratelimit-tools --bin bench_server --bin loadgen

# The rival, tower-rate-limiter: its own crate (not in the workspace), which
# needs the nightly toolchain. Without it, or when it does not build, its
# variants are left out and the report says so.
RIVAL_MISSING=""
case " $VARIANTS " in
  *" rival "* | *" rival-redis "*)
    if ! cargo +nightly --version >/dev/null 2>&1; then
      RIVAL_MISSING="no nightly toolchain to build tools/rival (rustup toolchain install nightly)"
    elif ! cargo +nightly build --quiet --release --manifest-path tools/rival/Cargo.toml; then
      RIVAL_MISSING="tools/rival did not build with cargo +nightly"
    fi
    if [ -n "$RIVAL_MISSING" ]; then
      echo "bench.sh: tower-rate-limiter left out: $RIVAL_MISSING" >&2
      kept=""
      for v in $VARIANTS; do
        case $v in rival | rival-redis) ;; *) kept="$kept $v" ;; esac
      done
      VARIANTS=${kept# }
    fi
    ;;
esac
export RIVAL_MISSING

# Variants named VARIANT@base run the bench_server of BASE_REV (the working
# tree's tools/src/bin/bench_server.rs built against that revision of the crate),
# side by side with the working tree's, in the same rounds.
BASE_BIN=""
if [ -n "${BASE_REV:-}" ]; then
  BASE_REV=$(revision "$BASE_REV")
  BASE_TREE=$(mktemp -d)
  rmdir "$BASE_TREE"
  # A target directory of its own, kept between runs: a rebuild of the same
  # revision is quick.
  build_at "$BASE_REV" "$BASE_TREE" bench_server "$CARGO_TARGET_DIR/bench-base" --features redis
  git worktree remove --force "$BASE_TREE"
  BASE_BIN=$BUILT
fi

WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# One Redis for every variant: plain TCP on RPORT and, for the redis-tls
# variants, TLS on TPORT with a CA made for the run.
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=bench CA" \
  -keyout "$WORK/ca.key" -out "$WORK/ca.pem" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
  -keyout "$WORK/redis.key" -out "$WORK/redis.csr" 2>/dev/null
openssl x509 -req -in "$WORK/redis.csr" -CA "$WORK/ca.pem" -CAkey "$WORK/ca.key" -CAcreateserial \
  -days 2 -extfile <(printf 'subjectAltName=IP:127.0.0.1') -out "$WORK/redis.pem" 2>/dev/null
RPORT=$(free_port)
TPORT=$(free_port)
taskset -c "$LOAD_CPU" redis-server --port "$RPORT" --bind 127.0.0.1 --save "" --appendonly no \
  --tls-port "$TPORT" --tls-cert-file "$WORK/redis.pem" --tls-key-file "$WORK/redis.key" \
  --tls-ca-cert-file "$WORK/ca.pem" --tls-auth-clients no \
  >"$WORK/redis.log" 2>&1 &
RPID=$!
PIDS+=("$RPID")
wait_for_redis "$RPORT" "$WORK/redis.log"
rcli() { redis-cli -p "$RPORT" "$@"; }

TCK=$(getconf CLK_TCK)
# CPU steal (time the hypervisor gave to other guests) over the whole run.
steal_ticks() { awk '/^cpu / {print $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat; }
read -r STEAL0 TOTAL0 < <(steal_ticks)
# The app's user and kernel CPU ticks (utime, stime).
cpu_ticks() { awk '{print $14, $15}' "/proc/$1/stat"; }
redis_cpu() { rcli INFO cpu | tr -d '\r' | awk -F: '/^used_cpu_(sys|user):/ {s += $2} END {printf "%.6f", s}'; }
redis_cmds() {
  rcli INFO commandstats | tr -d '\r' |
    awk -F'[:=,]' '/^cmdstat_(evalsha|eval|ping|unwatch|script|exec):/ {s += $3} END {print s + 0}'
}

SRV_PID=""
SRV_ADDR=""
start_server() { # variant [extra args...]
  local v=$1 bin=$BIN/bench_server url="redis://127.0.0.1:$RPORT" tls=()
  shift
  case $v in
    *@base)
      [ -n "$BASE_BIN" ] || { echo "bench.sh: $v needs BASE_REV" >&2; exit 2; }
      v=${v%@base}
      bin=$BASE_BIN
      ;;
    rival | rival-redis) bin=$BIN/rival_server ;;
  esac
  case $v in
    redis-tls | redis-tls-bare)
      url="rediss://127.0.0.1:$TPORT"
      tls=(--redis-ca "$WORK/ca.pem")
      v=${v/-tls/}
      ;;
  esac
  # Emptied here, not by the background job's redirection, which may come
  # after the first look below and show the previous server's address.
  : >"$WORK/srv.out"
  # shellcheck disable=SC2086 # APP_ENV: one word per assignment
  env $APP_ENV taskset -c "$APP_CPU" "$bin" --variant "$v" --listen 127.0.0.1:0 --workers 1 \
    --redis-url "$url" "${tls[@]}" "$@" >"$WORK/srv.out" 2>"$WORK/srv.err" &
  SRV_PID=$!
  PIDS+=("$SRV_PID")
  for _ in $(seq 200); do
    SRV_ADDR=$(sed -n 's/^listening on //p' "$WORK/srv.out")
    [ -n "$SRV_ADDR" ] && return
    sleep 0.05
  done
  echo "${bin##*/} --variant $v did not start:" >&2
  cat "$WORK/srv.err" >&2
  exit 1
}
stop_server() {
  # SIGKILL: an overloaded server must not keep draining into the next run.
  kill -9 "$SRV_PID" 2>/dev/null || true
  wait "$SRV_PID" 2>/dev/null || true
}

# wrk prints latencies as 812.00us / 1.20ms / 1.01s.
to_us() { awk -v v="$1" 'BEGIN {
  n = v + 0
  if (v ~ /us$/) print n; else if (v ~ /ms$/) print n * 1000; else if (v ~ /s$/) print n * 1000000; else print n }'; }

RESULTS=$WORK/results
: >"$RESULTS"

saturate() { # round variant
  local r=$1 v=$2
  start_server "$v"
  taskset -c "$LOAD_CPU" wrk -t2 -c"$CONNS" -d1s "http://$SRV_ADDR/" >/dev/null # warm up
  local u0 s0 rc0 rq0 u1 s1 rc1 rq1
  read -r u0 s0 < <(cpu_ticks "$SRV_PID"); rc0=$(redis_cpu); rq0=$(redis_cmds)
  taskset -c "$LOAD_CPU" wrk -t2 -c"$CONNS" -d"${SECS}s" --latency "http://$SRV_ADDR/" >"$WORK/wrk.txt"
  read -r u1 s1 < <(cpu_ticks "$SRV_PID"); rc1=$(redis_cpu); rq1=$(redis_cmds)
  stop_server
  local reqs rps p50 p99 non2xx
  reqs=$(awk '/requests in/ {print $1}' "$WORK/wrk.txt")
  rps=$(awk '/^Requests\/sec:/ {print $2}' "$WORK/wrk.txt")
  p50=$(to_us "$(awk '$1 == "50%" {print $2}' "$WORK/wrk.txt")")
  p99=$(to_us "$(awk '$1 == "99%" {print $2}' "$WORK/wrk.txt")")
  non2xx=$(awk '/Non-2xx/ {print $NF}' "$WORK/wrk.txt")
  per_req() { awk -v a="$1" -v b="$2" -v n="$reqs" -v t="$TCK" 'BEGIN {printf "%.2f", (b - a) / t * 1e6 / n}'; }
  # Fields: rps p50 p99 cpu cmds redis-cpu non-2xx user kernel (µs a request).
  echo "sat $r $v $rps $p50 $p99 $(per_req $((u0 + s0)) $((u1 + s1))) \
$(awk -v a="$rq0" -v b="$rq1" -v n="$reqs" 'BEGIN {printf "%.3f", (b - a) / n}') \
$(awk -v a="$rc0" -v b="$rc1" -v n="$reqs" 'BEGIN {printf "%.2f", (b - a) * 1e6 / n}') ${non2xx:-0} \
$(per_req "$u0" "$u1") $(per_req "$s0" "$s1")" | tee -a "$RESULTS" >&2
}

fixed() { # round variant rate
  local r=$1 v=$2 rate=$3
  start_server "$v"
  taskset -c "$LOAD_CPU" wrk -t1 -c8 -d1s "http://$SRV_ADDR/" >/dev/null # warm up
  local line
  line=$(taskset -c "$LOAD_CPU" "$BIN/loadgen" --url "http://$SRV_ADDR/" --rate "$rate" --secs "$FIXED_SECS")
  stop_server
  sleep 1 # let Redis drain what a killed server left queued
  echo "fixed $r $v $rate $line" | tee -a "$RESULTS" >&2
}

hammer() { # label extra-args...
  local label=$1
  shift
  start_server redis --limit 10 "$@"
  local rq0 rq1 reqs
  rq0=$(redis_cmds)
  taskset -c "$LOAD_CPU" wrk -t2 -c16 -d3s "http://$SRV_ADDR/" >"$WORK/wrk.txt"
  rq1=$(redis_cmds)
  stop_server
  reqs=$(awk '/requests in/ {print $1}' "$WORK/wrk.txt")
  echo "hammer $label $reqs $(awk '/Non-2xx/ {print $NF}' "$WORK/wrk.txt") $((rq1 - rq0))" | tee -a "$RESULTS" >&2
}

echo "saturation: $ROUNDS rounds x ($VARIANTS) x ${SECS}s, wrk -t2 -c$CONNS" >&2
for r in $(seq "$ROUNDS"); do
  for v in $VARIANTS; do saturate "$r" "$v"; done
done

BASE=$(awk '$1 == "sat" && $3 == "none" {print $4}' "$RESULTS" | sort -n |
  awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}')
# Fractions of the no-limiter median to offer at a fixed rate (half is the
# documented target; a quarter shows the added latency where every variant keeps up).
for frac in ${FIXED_FRACTIONS:-0.5 0.25}; do
  RATE=$(awk -v b="$BASE" -v f="$frac" 'BEGIN {printf "%d", b * f}')
  echo "fixed rate: $RATE req/s ($frac of the no-limiter median), ${FIXED_SECS}s per variant" >&2
  for r in $(seq "$ROUNDS"); do
    for v in $VARIANTS; do fixed "$r" "$v" "$RATE"; done
  done
done

failopen() { # connections
  local conns=$1 reqs failures
  start_server redis --count-failures --no-deny-cache
  taskset -c "$LOAD_CPU" wrk -t2 -c"$conns" -d"${SECS}s" "http://$SRV_ADDR/" >"$WORK/wrk.txt"
  failures=$(curl -sf "http://$SRV_ADDR/failures")
  stop_server
  reqs=$(awk '/requests in/ {print $1}' "$WORK/wrk.txt")
  echo "failopen $conns $reqs $failures" | tee -a "$RESULTS" >&2
}

# The hammering client and the fail-open counts run against the Redis
# variant: only when a Redis variant is in the run.
HAMMER=""
for v in $VARIANTS; do
  case $v in redis | redis-bare) HAMMER=1 ;; esac
done
if [ -n "$HAMMER" ]; then
  echo "hammering client: quota 10/min, wrk -c16 3s" >&2
  hammer "deny cache on"
  hammer "deny cache off" --no-deny-cache
  # An instance saturated by its clients, with a healthy Redis, must still
  # decide every request with its store.
  ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
  for conns in 64 2000; do
    echo "fail-open count: redis variant, no deny cache, wrk -c$conns ${SECS}s" >&2
    failopen "$conns"
  done
fi

read -r STEAL1 TOTAL1 < <(steal_ticks)
STEAL=$(awk -v a="$STEAL0" -v b="$STEAL1" -v c="$TOTAL0" -v d="$TOTAL1" 'BEGIN {printf "%.1f", (b - a) * 100 / (d - c)}')
MACHINE="$(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), $(uname -sr), $(redis-server --version | awk '{print $1, $2, $3}')"
[ -z "$APP_ENV" ] || MACHINE="$MACHINE; every app ran with $APP_ENV"
python3 scripts/bench_report.py "$RESULTS" "$MACHINE" "$ROUNDS" "$SECS" "$FIXED_SECS" "$CONNS" "$STEAL"
