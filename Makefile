# mlx-native for Deno — build, test and run.
#
#   make demo    the main job (decode demo on the best available backend)
#   make test    the whole test suite (builds everything it needs first)
#   make bench   deno bench
#   make check   kernel tables fresh, fmt --check, lint, import-cycle check, strict type check, doc lint, native layering
#
# Needs only node/npm, make and a C compiler: Deno is installed into .tools/ from npm when it is not
# on PATH; the native library is built with clang when present, else cc.

DENO_VERSION := 2.9.6
UNAME_S := $(shell uname -s)

# --- Deno: the one on PATH, else a pinned copy from npm in .tools/ ---------------------------
SYSTEM_DENO := $(shell command -v deno 2>/dev/null)
ifeq ($(SYSTEM_DENO),)
  DENO := $(CURDIR)/.tools/node_modules/deno/deno
  DENO_DEP := $(DENO)
else
  DENO := $(SYSTEM_DENO)
  DENO_DEP :=
endif

# --- C toolchain ---------------------------------------------------------------------------------
CC := $(shell command -v clang 2>/dev/null || echo cc)
CFLAGS_COMMON := -std=c11 -O2 -fPIC -pthread -Wall -Wextra -Wno-unused-parameter -ffp-contract=off \
  -fvisibility=hidden -D_POSIX_C_SOURCE=200809L
ifeq ($(UNAME_S),Darwin)
  SO := dylib
  SHARED := -dynamiclib
  CFLAGS_COMMON += -D_DARWIN_C_SOURCE
else
  SO := so
  SHARED := -shared
endif

CPU_LIB := build/libmlxn_cpu.$(SO)
CORE_SRC := $(wildcard native/core/*.c) $(wildcard native/contracts/*.c)
CORE_HDR := native/mlxn.h native/core/internal.h native/core/backend.h native/core/tracker.h $(wildcard native/contracts/*.h)
CPU_SRC := $(CORE_SRC) $(wildcard native/cpu/*.c) $(wildcard kernels/cpu/*.c)
CPU_HDR := $(CORE_HDR) kernels/cpu/cpu_kernel.h

DENO_TEST_FLAGS := --allow-ffi --allow-read --allow-env --allow-run --allow-write

.PHONY: all native demo test bench check fmt clean deno sanitize-test fuzz cuda metal metal-check gen
METAL_CHECK ?= ../shared/metal-check/check.sh

all: native

native: $(CPU_LIB) $(if $(filter Darwin,$(UNAME_S)),$(METAL_LIB))

$(CPU_LIB): $(CPU_SRC) $(CPU_HDR)
	@mkdir -p build
	$(CC) $(CFLAGS_COMMON) $(SHARED) -o $@ $(CPU_SRC) -ldl -lm

deno: $(DENO_DEP)

$(CURDIR)/.tools/node_modules/deno/deno:
	@echo "deno not on PATH: installing deno@$(DENO_VERSION) from npm into .tools/"
	@mkdir -p .tools
	cd .tools && npm install --no-audit --no-fund --loglevel=error --prefix . deno@$(DENO_VERSION)
	@test -x $@ || { echo "deno install failed: $@ is missing" >&2; exit 1; }
	@touch $@

demo: native $(DENO_DEP)
	$(DENO) run --allow-ffi --allow-read --allow-env examples/decode.ts

test: native $(DENO_DEP)
	DENO="$(DENO)" DENO_TEST_FLAGS="$(DENO_TEST_FLAGS)" bash scripts/test.sh

bench: native $(DENO_DEP)
	$(DENO) bench --allow-ffi --allow-read --allow-env bench/

check: $(DENO_DEP)
	$(DENO) run --allow-read --allow-run scripts/gen_kernels.ts --check
	$(DENO) fmt --check
	$(DENO) lint
	$(DENO) run --allow-run --allow-read scripts/check_cycles.ts src
	$(DENO) check mod.ts build.ts src/ examples/ tests/ bench/ scripts/check_cycles.ts
	$(DENO) doc --lint mod.ts build.ts
	$(DENO) publish --dry-run --allow-dirty
	bash scripts/check_layering.sh

fmt: $(DENO_DEP)
	$(DENO) fmt

# Every per-kernel table, from the kernel descriptions (kernels/spec/kernels.ts).
gen: $(DENO_DEP)
	$(DENO) run --allow-read --allow-write --allow-run scripts/gen_kernels.ts

# --- Metal backend (macOS; the default there): Objective-C over the core, MSL compiled at run time --
METAL_LIB := build/libmlxn_metal.dylib
METAL_SRC := kernels/metal/common.metal $(filter-out kernels/metal/common.metal,$(sort $(wildcard kernels/metal/*.metal)))

# The MSL sources as one C string literal, embedded in the dylib (no Xcode `metal` tool needed).
build/mlxn_metal_source.h: $(METAL_SRC)
	@mkdir -p build
	{ printf 'static const char mlxn_metal_source[] =\n'; \
	  sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/"/' -e 's/$$/\\n"/' $(METAL_SRC); printf ';\n'; } > $@

$(METAL_LIB): objc/mlxn_metal.m $(CORE_SRC) $(CORE_HDR) build/mlxn_metal_source.h
	clang $(CFLAGS_COMMON) -fno-objc-arc -Ibuild -dynamiclib -framework Metal -framework Foundation \
	  -o $@ objc/mlxn_metal.m $(CORE_SRC)

metal: $(METAL_LIB)

# Type-checks the Objective-C on Linux against Apple's macOS 11.3 SDK headers (see objc/README.md).
METAL_SDK ?= .metal-sdk/sdk-full/root
metal-check: build/mlxn_metal_source.h metal-check-msl
	bash $(METAL_CHECK) --apple-sdk $(METAL_SDK) objc/mlxn_metal.m -Ibuild
	bash $(METAL_CHECK) --apple-sdk $(METAL_SDK) $(CORE_SRC) -D_DARWIN_C_SOURCE

include mk/metal_emu.mk

# --- CUDA backend (make cuda): the core and the kernel contracts in C, kernels and graphs in CUDA -----
NVCC ?= nvcc
CUDA_LIB := build/libmlxn_cuda.so
CUDA_C_SRC := $(CORE_SRC) native/cuda/bridge.c
CUDA_CU_SRC := native/cuda/backend.cu $(wildcard kernels/cuda/*.cu)
CUDA_HDR := $(CORE_HDR) native/cuda/cuda_api.h kernels/cuda/common.cuh kernels/cuda/params.gen.cuh
CUDA_ARCH := -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
  -gencode arch=compute_90,code=compute_90
# Objects of this source list only: build/cuda-obj may hold objects of sources that no longer exist.
CUDA_OBJ := $(addprefix build/cuda-obj/,$(addsuffix .o,$(subst /,_,$(CUDA_C_SRC) $(CUDA_CU_SRC))))
NVCC_FLAGS := -std=c++17 -O3 $(CUDA_ARCH) -Xcompiler -fPIC,-fvisibility=hidden

$(CUDA_LIB): $(CUDA_C_SRC) $(CUDA_CU_SRC) $(CUDA_HDR)
	@mkdir -p build/cuda-obj
	@for f in $(CUDA_C_SRC); do \
	  o=build/cuda-obj/$$(echo $$f | tr / _).o; \
	  echo "$(CC) -c $$f"; $(CC) $(CFLAGS_COMMON) -c -o $$o $$f || exit 1; \
	done
	@for f in $(CUDA_CU_SRC); do \
	  o=build/cuda-obj/$$(echo $$f | tr / _).o; \
	  echo "$(NVCC) -c $$f"; $(NVCC) $(NVCC_FLAGS) -c -o $$o $$f || exit 1; \
	done
	$(NVCC) -shared $(CUDA_ARCH) -o $@ $(CUDA_OBJ) -lpthread -ldl -lm

cuda: $(CUDA_LIB)

# --- hardening: the suite against an ASan+UBSan build, and the command-stream fuzzer (clang) --------
SAN_LIB := build/san/libmlxn_cpu.$(SO)
SAN_FLAGS := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
FUZZ_BIN := build/fuzz_stream
FUZZ_LIKE_BIN := build/fuzz_replay_like
LIKE_CORPUS := build/like-corpus/.made
FUZZ_TIME ?= 30
FUZZ_RUNS ?= -1

$(SAN_LIB): $(CPU_SRC) $(CPU_HDR)
	@command -v clang >/dev/null || { echo "sanitize-test needs clang" >&2; exit 1; }
	@mkdir -p build/san
	clang $(CFLAGS_COMMON) $(SAN_FLAGS) $(SHARED) -o $@ $(CPU_SRC) -ldl -lm

# First every seed of the fuzz corpus executes once in the instrumented fuzz target (each CPU kernel
# runs at least once, with the new hostile cases refused); then the suite, whose kernel, safety and
# lifecycle tests execute too. Deno itself is not instrumented: the ASan runtime is preloaded and the
# library picked via MLXN_LIB.
sanitize-test: $(SAN_LIB) $(FUZZ_BIN) $(FUZZ_LIKE_BIN) $(LIKE_CORPUS) $(DENO_DEP)
	$(FUZZ_BIN) tests/fuzz/corpus/*.bin > build/sanitize-corpus.log 2>&1 || { cat build/sanitize-corpus.log; exit 1; }
	@echo "sanitize-test: $$(grep -c '^Executed' build/sanitize-corpus.log) fuzz corpus seeds executed under ASan+UBSan"
	$(FUZZ_LIKE_BIN) build/like-corpus/*.bin > build/sanitize-like-corpus.log 2>&1 || { cat build/sanitize-like-corpus.log; exit 1; }
	@echo "sanitize-test: $$(grep -c '^Executed' build/sanitize-like-corpus.log) replay-like seeds agree with the decoder"
	LD_PRELOAD=$$(clang -print-file-name=libclang_rt.asan-x86_64.so) \
	ASAN_OPTIONS=detect_leaks=0:halt_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	MLXN_LIB=$(CURDIR)/$(SAN_LIB) DENO="$(DENO)" DENO_TEST_FLAGS="$(DENO_TEST_FLAGS)" bash scripts/test.sh

$(FUZZ_BIN): tests/fuzz/fuzz_stream.c $(CPU_SRC) $(CPU_HDR)
	@command -v clang >/dev/null || { echo "fuzz needs clang" >&2; exit 1; }
	@mkdir -p build
	clang $(CFLAGS_COMMON) -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	  -o $@ tests/fuzz/fuzz_stream.c $(CPU_SRC) -ldl -lm

# The replay-like seeds are derived from the stream corpus (tests/fuzz/make_like_corpus.ts).
$(LIKE_CORPUS): tests/fuzz/make_like_corpus.ts $(wildcard tests/fuzz/corpus/*.bin) $(DENO_DEP)
	$(DENO) run --allow-read --allow-write tests/fuzz/make_like_corpus.ts build/like-corpus
	@touch $@

$(FUZZ_LIKE_BIN): tests/fuzz/fuzz_replay_like.c $(CPU_SRC) $(CPU_HDR)
	@command -v clang >/dev/null || { echo "fuzz needs clang" >&2; exit 1; }
	@mkdir -p build
	clang $(CFLAGS_COMMON) -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	  -o $@ tests/fuzz/fuzz_replay_like.c $(CPU_SRC) -ldl -lm

# The stream target decodes each input and executes what it accepts (tests/fuzz/fuzz_stream.c); the
# replay-like target checks replays by a mutated stream against decoding it
# (tests/fuzz/fuzz_replay_like.c). Each bounded by FUZZ_TIME seconds (or FUZZ_RUNS executions); new
# inputs go to build/fuzz-corpus and build/fuzz-like-corpus.
fuzz: $(FUZZ_BIN) $(FUZZ_LIKE_BIN) $(LIKE_CORPUS)
	@mkdir -p build/fuzz-corpus build/fuzz-like-corpus
	$(FUZZ_BIN) -max_total_time=$(FUZZ_TIME) -runs=$(FUZZ_RUNS) -print_final_stats=1 \
	  build/fuzz-corpus tests/fuzz/corpus
	$(FUZZ_LIKE_BIN) -max_total_time=$(FUZZ_TIME) -runs=$(FUZZ_RUNS) -print_final_stats=1 \
	  build/fuzz-like-corpus build/like-corpus

clean:
	rm -rf build
