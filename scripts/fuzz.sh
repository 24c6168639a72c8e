#!/usr/bin/env bash
# Runs the cargo-fuzz targets in fuzz/, each for SECONDS (default 20), from
# its committed seeds (fuzz/seeds/TARGET) and a working corpus kept between
# runs (fuzz/corpus/TARGET, not committed). A crash stops the run: libFuzzer
# writes the input to fuzz/artifacts/TARGET/, and `cargo fuzz run TARGET
# fuzz/artifacts/TARGET/crash-…` replays it.
#
#   scripts/fuzz.sh                     # every target, 20 s each (what .ci/run does)
#   scripts/fuzz.sh 600                 # every target, 10 minutes each
#   scripts/fuzz.sh 60 redis_keys       # one target
#
# Needs cargo-fuzz (installed with `cargo install` when missing) and a
# nightly toolchain; without one, stable builds the targets with
# RUSTC_BOOTSTRAP=1 (and without a sanitizer).
set -euo pipefail

cd "$(dirname "$0")/.."
SECS=${1:-20}
shift || true
TARGETS=${*:-"client_ip header_keys redis_keys ietf_headers demo_args redis_replies policy_text"}

toolchain=()
sanitizer=()
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  toolchain=(+nightly)
else
  echo "fuzz.sh: no nightly toolchain; building with stable and RUSTC_BOOTSTRAP=1, no sanitizer" >&2
  export RUSTC_BOOTSTRAP=1
  sanitizer=(--sanitizer none)
fi
if ! cargo "${toolchain[@]}" fuzz --help >/dev/null 2>&1; then
  echo "==> cargo install cargo-fuzz"
  cargo install --locked cargo-fuzz
fi

summary=$(mktemp)
trap 'rm -f "$summary"' EXIT
for t in $TARGETS; do
  mkdir -p "fuzz/corpus/$t" "fuzz/seeds/$t"
  echo "==> $t: ${SECS} s"
  log=$(mktemp)
  if ! cargo "${toolchain[@]}" fuzz run "${sanitizer[@]}" --fuzz-dir fuzz "$t" \
    "fuzz/corpus/$t" "fuzz/seeds/$t" -- -max_total_time="$SECS" -print_final_stats=1 \
    2>&1 | tee "$log" | grep -E '^(#[0-9]+ +(DONE|INITED)|==[0-9]+==|thread .* panicked|Failing input|SUMMARY)'; then
    :
  fi
  if grep -qE 'Failing input|panicked|ERROR: libFuzzer|SUMMARY: .*Sanitizer' "$log"; then
    echo "fuzz.sh: $t crashed; the input is in fuzz/artifacts/$t/" >&2
    tail -40 "$log" >&2
    rm -f "$log"
    exit 1
  fi
  runs=$(awk '/stat::number_of_executed_units/ {print $NF}' "$log" | tail -1)
  echo "| $t | ${SECS} s | ${runs:-?} | $(find "fuzz/corpus/$t" -type f | wc -l) |" >>"$summary"
  rm -f "$log"
done
echo
echo "| target | time | executions | corpus inputs |"
echo "|---|---:|---:|---:|"
cat "$summary"
