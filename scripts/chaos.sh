#!/usr/bin/env bash
# The chaos soak (tests/redis/chaos.rs): four rate-limit layers on one Redis
# primary with a replica, found through three sentinels, under concurrent
# load, while faults picked at random hit the primary: frozen (SIGSTOP),
# writes paused, restarted on its port, scripts flushed, answering OOM,
# blocked (DEBUG SLEEP), failed over to the replica. Every answer must be a
# 200, a 429 or the failure policy's 503, none may wait past its bound,
# nothing may panic, and once the faults stop the limits are exact again
# after one breaker cool-down, with no key left without a TTL.
#
#   scripts/chaos.sh                 # 60 s, a fresh seed (printed)
#   scripts/chaos.sh 300             # five minutes
#   CHAOS_SEED=42 scripts/chaos.sh   # the same faults as the run with seed 42
#
# Installs redis-server and redis-sentinel when missing; the soak starts
# its own processes on free 127.0.0.1 ports and stops them by PID.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
install_missing "redis-server redis-tools redis-sentinel" redis-server redis-cli redis-sentinel

export CHAOS_SECS=${1:-${CHAOS_SECS:-60}}
cargo test --all-features --test redis -- --ignored --nocapture chaos::
