#!/usr/bin/env bash
# Runs the whole test suite and ends with a plain "N passed, N failed" line.
# Called by `make test` with DENO and DENO_TEST_FLAGS set.
set -uo pipefail
DENO=${DENO:-deno}
FLAGS=${DENO_TEST_FLAGS:---allow-ffi --allow-read --allow-env --allow-run --allow-write}
log=$(mktemp)
# shellcheck disable=SC2086
"$DENO" test $FLAGS tests/ 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
summary=$(sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -E '^(ok|FAILED) \| [0-9]+ passed' | tail -n 1)
rm -f "$log"
passed=$(grep -oE '[0-9]+ passed' <<<"$summary" | grep -oE '[0-9]+' || true)
failed=$(grep -oE '[0-9]+ failed' <<<"$summary" | grep -oE '[0-9]+' || true)
if [ -z "$summary" ]; then
  # The runner never reached its summary (type error, crash): count that as a failure.
  passed=0
  failed=1
fi
[ "$rc" -ne 0 ] && [ "${failed:-0}" -eq 0 ] && failed=1
echo "${passed:-0} passed, ${failed:-0} failed"
exit "$rc"
