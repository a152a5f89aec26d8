#!/usr/bin/env bash
# The layering, checked on the sources (run by `make check`):
#  1. native/core is backend-neutral: it includes nothing from kernels/cpu (kernel contracts live
#     outside any backend's kernels).
#  2. A backend other than the CPU one (native/cuda, objc, metal_emu) includes nothing from
#     kernels/cpu, and of the core only its interface, native/core/backend.h (internal.h is private).
#  3. src/graph is a leaf of the TypeScript layers: its modules import each other and src/errors.ts
#     only (no encoder, executor, kernel registry or native layer).
# Prints each offending #include and exits 1, or prints "layering: ok".
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

bad=0
# #include lines of the C, C++, CUDA and Objective-C sources under the given folders.
includes() {
  find "$@" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.m' -o -name '*.cpp' \) \
    -print0 2>/dev/null | xargs -0 -r grep -nHE '^[[:space:]]*#[[:space:]]*(include|import)[[:space:]]*[<"]'
}
report() { # why, offending lines
  [ -z "$2" ] && return
  echo "layering: $1:" >&2
  sed 's/^/  /' <<<"$2" >&2
  bad=1
}

report "native/core includes kernels/cpu (the core must not depend on one backend's kernels)" \
  "$(includes native/core | grep -E '[<"][^">]*kernels/cpu/')"

other_backends=(native/cuda objc metal_emu)
report "a backend other than native/cpu includes kernels/cpu" \
  "$(includes "${other_backends[@]}" | grep -E '[<"][^">]*kernels/cpu/')"
report "a backend includes a private header of the core (only native/core/backend.h is its interface)" \
  "$(includes "${other_backends[@]}" native/cpu | grep -E '[<"][^">]*core/[^">]*\.h[">]' |
    grep -vE '[<"][^">]*core/backend\.h[">]')"

report "src/graph imports outside the graph layer (only ./*.ts and ../errors.ts)" \
  "$(grep -nHE '(from|^import)[[:space:]]*"' src/graph/*.ts | grep -vE '^[^:]+:[0-9]+:[[:space:]]*\*' | grep -vE '(from|import)[[:space:]]*"(\./[a-z_]+\.ts|\.\./errors\.ts)"')"

if [ "$bad" -ne 0 ]; then
  exit 1
fi
echo "layering: ok"
