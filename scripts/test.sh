#!/usr/bin/env bash
# Runs the whole test suite: the ONE command for developers and CI.
#
#   scripts/test.sh [extra cargo test args...]
#
# * Installs what the tests run when it is missing, without starting any
#   distribution service: redis-server and redis-cli (Debian: redis-server,
#   redis-tools), redis-sentinel, and the openssl CLI (the TLS tests make
#   their own CA and certificates with it). Tests never use the system
#   service or port 6379: the harness in tests/support/ starts its own
#   redis-server and redis-sentinel processes on free 127.0.0.1 ports (or
#   Unix sockets) and kills them by PID.
# * A Redis test never passes without Redis: one that cannot run
#   redis-server, redis-sentinel or openssl fails, saying to run this script.
#   Under CI=true anything still missing stops the run before cargo starts.
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

have_all() { have redis-server && have redis-cli && have redis-sentinel && have openssl; }

if ! have_all; then
  echo "==> installing what is missing of redis-server redis-tools redis-sentinel openssl (apt-get)"
  apt_install redis-server redis-tools redis-sentinel openssl || echo "test.sh: installing failed" >&2
fi

if have_all; then
  echo "==> using $(command -v redis-server): $(redis-server --version)"
elif is_ci; then
  echo "test.sh: redis-server, redis-cli, redis-sentinel or openssl still missing under CI=true;" >&2
  echo "test.sh: the Redis tests cannot run. Install the Debian packages redis-server," >&2
  echo "test.sh: redis-tools, redis-sentinel and openssl." >&2
  exit 1
else
  echo "!!!!!!!!!! redis-server, redis-sentinel or openssl missing: the Redis tests will FAIL !!!!!!!!!!" >&2
fi

echo "==> cargo test --all-features --all-targets $*"
cargo test --all-features --all-targets "$@"

echo "==> cargo test --all-features --doc $*"
cargo test --all-features --doc "$@"
