#!/usr/bin/env bash
# Runs the whole test suite: the ONE command for developers and CI.
#
#   scripts/test.sh [extra cargo test args...]
#
# * Installs redis-server + redis-cli (Debian: redis-server, redis-tools) when
#   they are missing, without starting the distro's redis service. Tests never
#   use the system service or port 6379: the harness in tests/support/redis.rs
#   starts its own redis-server processes on free 127.0.0.1 ports and kills
#   them by PID.
# * Under CI=true a missing Redis is an error, and REQUIRE_REDIS=1 is exported
#   so that Redis tests fail instead of being skipped.
# * Runs `cargo test --all-features --all-targets` and then the doctests
#   (`--all-targets` does not include them), passing "$@" to both.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

is_ci() {
  case "${CI:-}" in
    true | TRUE | True | 1 | yes) return 0 ;;
    *) return 1 ;;
  esac
}

have() { command -v "$1" >/dev/null 2>&1; }

have_redis() { have redis-server && have redis-cli; }

if ! have_redis; then
  echo "==> redis-server/redis-cli not found: installing redis-server redis-tools (apt-get)"
  apt_install redis-server redis-tools || echo "test.sh: installing redis failed" >&2
fi

if have_redis; then
  echo "==> using $(command -v redis-server): $(redis-server --version)"
elif is_ci; then
  echo "test.sh: redis-server/redis-cli still missing under CI=true; the Redis tests cannot run." >&2
  echo "test.sh: install the Debian packages redis-server and redis-tools." >&2
  exit 1
else
  echo "!!!!!!!!!! redis-server/redis-cli missing: the Redis tests will be SKIPPED !!!!!!!!!!" >&2
fi

if is_ci; then
  export REQUIRE_REDIS=1
fi

echo "==> cargo test --all-features --all-targets $*"
cargo test --all-features --all-targets "$@"

echo "==> cargo test --all-features --doc $*"
cargo test --all-features --doc "$@"
