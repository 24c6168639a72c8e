# Shared by scripts/bench.sh and scripts/script_cost.sh (sourced, not run).

# A 127.0.0.1 TCP port nothing listens on (never Redis's default 6379).
free_port() {
  local p
  while :; do
    p=$((20000 + RANDOM % 30000))
    (: </dev/tcp/127.0.0.1/$p) 2>/dev/null || { echo "$p"; return; }
  done
}
