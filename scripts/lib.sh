# shellcheck shell=bash
# Shared by scripts/bench.sh, scripts/script_cost.sh and scripts/layer_cost.sh
# (sourced, not run).

# A 127.0.0.1 TCP port nothing listens on (never Redis's default 6379).
free_port() {
  local p
  while :; do
    p=$((20000 + RANDOM % 30000))
    (: </dev/tcp/127.0.0.1/$p) 2>/dev/null || { echo "$p"; return; }
  done
}

# The revision to compare with: $1, or HEAD; exits with 2 naming the script
# when it is not a commit.
revision() {
  local rev=${1:-HEAD}
  git rev-parse --verify --quiet "$rev^{commit}" >/dev/null || {
    echo "$(basename "$0"): no revision $rev" >&2
    exit 2
  }
  echo "$rev"
}
