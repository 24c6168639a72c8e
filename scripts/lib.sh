# shellcheck shell=bash
# Shared by scripts/bench.sh, scripts/script_cost.sh, scripts/layer_cost.sh
# and scripts/server_cost.sh (sourced, not run).

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

# Installs the Debian packages PACKAGES (one word, space-separated) with apt
# unless every command named after them is there already.
install_missing() { # "packages" command...
  local pkgs=$1 c
  shift
  for c in "$@"; do
    command -v "$c" >/dev/null 2>&1 && continue
    echo "$(basename "$0"): installing $pkgs with apt" >&2
    local sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    # shellcheck disable=SC2086 # one word per package
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
      "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $pkgs >/dev/null
    return
  done
}

# Builds the working tree's examples/NAME.rs against revision REV, checked
# out in a new git worktree TREE (the caller removes it), into the cargo
# target directory TARGET, with cargo ARGS. A revision older than
# `RateLimitLayer::inner_body` builds it without that call: there, the
# layer's responses can only be wrapped.
build_at() { # rev tree name target [cargo args...]
  local rev=$1 tree=$2 name=$3 target=$4
  shift 4
  git worktree add --quiet --detach "$tree" "$rev"
  cp "examples/$name.rs" "$tree/examples/$name.rs"
  if ! grep -q "fn inner_body" "$tree/src/layer.rs"; then
    echo "$(basename "$0"): $rev has no inner_body(); its $name wraps response bodies" >&2
    sed -i 's/\.inner_body()//' "$tree/examples/$name.rs"
  fi
  (cd "$tree" && CARGO_TARGET_DIR=$target cargo build --quiet --release --example "$name" "$@")
}

# Waits up to 5 s for the redis-server on 127.0.0.1:PORT to answer PING;
# fails, showing its LOG, if it never does.
wait_for_redis() { # port log
  local _
  for _ in $(seq 100); do
    [ "$(redis-cli -p "$1" PING 2>/dev/null)" = PONG ] && return
    sleep 0.05
  done
  echo "$(basename "$0"): redis-server did not start:" >&2
  cat "$2" >&2
  return 1
}
