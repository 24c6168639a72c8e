# shellcheck shell=bash
# Shared by scripts/test.sh, scripts/bench.sh, scripts/script_cost.sh,
# scripts/layer_cost.sh, scripts/server_cost.sh, scripts/instructions.sh,
# scripts/criterion_compare.sh and scripts/criterion_instructions.sh
# (sourced, not run).

# A 127.0.0.1 TCP port nothing listens on (never Redis's default 6379),
# below the kernel's ephemeral range: a port in that range may be taken as
# the local end of any outgoing connection (the load generators open
# thousands) between this check and the server's bind.
free_port() {
  local low=32768 p
  read -r low _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || true
  [ "$low" -gt 12000 ] 2>/dev/null || low=32768
  while :; do
    p=$((10000 + RANDOM % (low - 10000)))
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

# Installs Debian PACKAGES with apt-get (through sudo when not root), without
# letting their maintainer scripts start a service (redis-server's would
# listen on 6379, which nothing here uses). Fails, saying why, when it cannot.
apt_install() { # package...
  local me sudo=()
  me=$(basename "$0")
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
      sudo=(sudo)
    else
      echo "$me: not root and no sudo: cannot install $*" >&2
      return 1
    fi
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "$me: no apt-get: install $* yourself" >&2
    return 1
  fi
  # Only if no policy is in place already.
  local policy=/usr/sbin/policy-rc.d added_policy=0
  if [ ! -e "$policy" ]; then
    if printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null &&
      "${sudo[@]}" chmod 755 "$policy"; then
      added_policy=1
    fi
  fi
  local rc=0
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q || rc=$?
  if [ "$rc" -eq 0 ]; then
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -q --no-install-recommends "$@" || rc=$?
  fi
  if [ "$added_policy" -eq 1 ]; then
    "${sudo[@]}" rm -f "$policy"
  fi
  return "$rc"
}

# Installs the Debian packages PACKAGES (one word, space-separated) with
# apt_install unless every command named after them is there already.
install_missing() { # "packages" command...
  local pkgs=$1 c
  shift
  for c in "$@"; do
    command -v "$c" >/dev/null 2>&1 && continue
    echo "$(basename "$0"): installing $pkgs with apt" >&2
    # shellcheck disable=SC2086 # one word per package
    apt_install $pkgs >&2
    return
  done
}

# Builds the working tree's tool tools/src/bin/NAME.rs against revision REV,
# checked out in a new git worktree TREE (the caller removes it), into the
# cargo target directory TARGET, and sets BUILT to the binary's path. A
# revision from before the tools had a package of their own builds it as
# examples/NAME.rs (its paths to the repository's files made one directory
# shorter) with cargo ARGS, the features it needs there. A revision older
# than `RateLimitLayer::inner_body` builds it without that call: there, the
# layer's responses can only be wrapped.
build_at() { # rev tree name target [cargo args for an older revision...]
  local rev=$1 tree=$2 name=$3 target=$4 src
  shift 4
  git worktree add --quiet --detach "$tree" "$rev"
  if [ -f "$tree/tools/Cargo.toml" ]; then
    src=$tree/tools/src/bin/$name.rs
    cp "tools/src/bin/$name.rs" "$src"
  else
    src=$tree/examples/$name.rs
    sed 's#"\.\./\.\./\.\./#"../#g' "tools/src/bin/$name.rs" >"$src"
  fi
  if ! grep -rq "fn inner_body" "$tree/src"; then
    echo "$(basename "$0"): $rev has no inner_body(); its $name wraps response bodies" >&2
    sed -i 's/\.inner_body()//' "$src"
  fi
  if [ -f "$tree/tools/Cargo.toml" ]; then
    (cd "$tree" && CARGO_TARGET_DIR=$target cargo build --quiet --release -p tower-ratelimit-tools --bin "$name")
    BUILT=$target/release/$name
  else
    (cd "$tree" && CARGO_TARGET_DIR=$target cargo build --quiet --release --example "$name" "$@")
    BUILT=$target/release/examples/$name
  fi
}

# Waits up to 20 s (a busy host starts it slowly) for the redis-server on
# 127.0.0.1:PORT to answer PING;
# fails, showing its LOG, if it never does.
wait_for_redis() { # port log
  local _
  for _ in $(seq 400); do
    [ "$(redis-cli -p "$1" PING 2>/dev/null)" = PONG ] && return
    sleep 0.05
  done
  echo "$(basename "$0"): redis-server did not start:" >&2
  cat "$2" >&2
  return 1
}

# The path of the memory bench binary cargo builds in directory $1.
bench_binary() {
  (cd "$1" && cargo bench --quiet --bench memory --no-run --message-format=json 2>/dev/null) |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "memory" and m.get("executable"):
        print(m["executable"])'
}

# The memory bench built at revision $1 (in a git worktree under directory
# $2, removed again) and in the working tree: sets BENCH_BASE (a copy of the
# revision's binary, in $2) and BENCH_HEAD.
bench_pair() { # revision dir
  local tree="$2/base" base rc=0
  git worktree add --quiet --detach "$tree" "$1"
  echo "$(basename "$0"): building $1 and the working tree" >&2
  base=$(bench_binary "$tree") || rc=$?
  if [ "$rc" -eq 0 ]; then cp "$base" "$2/memory-base" || rc=$?; fi
  git worktree remove --force "$tree"
  [ "$rc" -eq 0 ] || return "$rc"
  BENCH_BASE="$2/memory-base"
  BENCH_HEAD=$(bench_binary .)
}
