#!/usr/bin/env bash
# The CUDA backend's acceptance run, on a machine with an NVIDIA GPU (see shared/device/README.md):
# builds, runs the whole suite on CUDA, the demo in its three modes, the decode step at PyTorch's
# shapes (bf16; concurrency, graphs and programmatic launch on and off), the decode step's ablation,
# the submit-cost and per-kernel benchmarks, 40 runs of the exit probe (a script ending with work in
# flight), a CUPTI per-kernel profile of the decode step, and the PyTorch anchor when a copy of it
# is at .device/torch_decode.py. Logs go to $OUT (default build/gpu-logs). The device
# machine is offline: carry node_modules (the test deps) along with .device.
set -uo pipefail
OUT=${OUT:-build/gpu-logs}
mkdir -p "$OUT"
export CC=${CC:-gcc}
run() { # name, command…: logs stdout+stderr, records the exit code
  local name=$1; shift
  echo "== $name: $*" | tee -a "$OUT/summary.txt"
  local t0=$SECONDS
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "   exit $rc in $((SECONDS - t0)) s; last line: $(tail -n 1 "$OUT/$name.log")" | tee -a "$OUT/summary.txt"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.txt" 2>&1
run build make native cuda
run tests env MLXN_BACKEND=cuda bash scripts/test.sh
BIG="--layers 32 --hidden 2048 --heads 16 --kv-heads 4 --ffn 5632 --vocab 32000 --ctx 512 --quant bf16"
run demo deno run --allow-ffi --allow-read --allow-env examples/decode.ts --backend cuda
run decode_big deno run --allow-ffi --allow-read --allow-env examples/decode.ts --backend cuda $BIG --tokens 50 --warmup 5
run decode_big_serial env MLXN_CONCURRENCY=0 deno run --allow-ffi --allow-read --allow-env examples/decode.ts \
  --backend cuda $BIG --tokens 20 --warmup 3 --modes recorded/opt,direct/auto
run decode_big_nographs env MLXN_CUDA_GRAPHS=0 deno run --allow-ffi --allow-read --allow-env examples/decode.ts \
  --backend cuda $BIG --tokens 20 --warmup 3 --modes direct/auto
run decode_big_nopdl env MLXN_CUDA_PDL=0 deno run --allow-ffi --allow-read --allow-env examples/decode.ts \
  --backend cuda $BIG --tokens 50 --warmup 5 --modes direct/hand
run decode_ablation deno run --allow-ffi --allow-read --allow-env bench/decode_ablation.ts --backend cuda
run gpu_bench deno run --allow-ffi --allow-read --allow-env bench/gpu_bench.ts
run gpu_kernels deno run --allow-ffi --allow-read --allow-env bench/gpu_kernels_bench.ts
exit_probe() { # runs: how many of them exited uncleanly
  local bad=0
  for i in $(seq "$1"); do
    deno run --no-prompt --quiet --allow-ffi --allow-env tests/fixtures/exit_probe.ts || bad=$((bad + 1))
  done
  echo "$bad of $1 runs exited uncleanly"
}
run exit_probe env MLXN_BACKEND=cuda bash -c "$(declare -f exit_probe); exit_probe 40"
# Per-kernel device time inside the decode step (CUPTI; PDL off so that a kernel's time excludes its
# early start), when the toolkit has CUPTI.
if nvcc -std=c++17 -O2 -shared -Xcompiler -fPIC -o build/cupti_profile.so bench/cupti_profile.cpp -lcupti \
  >"$OUT/cupti_build.log" 2>&1; then
  run decode_cupti env MLXN_CUDA_PDL=0 CUDA_INJECTION64_PATH="$PWD/build/cupti_profile.so" \
    deno run --allow-ffi --allow-read --allow-env examples/decode.ts --backend cuda $BIG --tokens 100 --warmup 10 \
    --modes direct/hand
fi
if [ -f .device/torch_decode.py ]; then run torch python3 .device/torch_decode.py; fi
cat "$OUT/summary.txt"
