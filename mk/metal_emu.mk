# --- emulated Metal backend (make metal-emu): the MSL of kernels/metal/ compiled as C++ against the
# project's <metal_stdlib> (metal_emu/include/) and run with Metal's execution model on CPU threads.
# `make metal-check-msl` type-checks the MSL exactly as the Objective-C backend assembles it; it needs
# clang++ and Deno, no Apple SDK.
CXX_EMU ?= $(shell command -v clang++ 2>/dev/null || echo clang++)
METAL_EMU_DIR := build/metal_emu
METAL_EMU_LIB := build/libmlxn_metal_emu.$(SO)
METAL_EMU_CPP := $(METAL_EMU_DIR)/kernels.cpp
METAL_EMU_OBJ := $(METAL_EMU_DIR)/kernels.o
METAL_EMU_SRC := metal_emu/backend.c metal_emu/runtime.c
METAL_EMU_HDR := metal_emu/runtime.h metal_emu/emu_abi.h $(wildcard metal_emu/include/*)
METAL_FRONT := metal_emu/msl_front.ts
METAL_FRONT_RUN = CXX="$(CXX_EMU)" $(DENO) run --allow-read --allow-write --allow-run --allow-env $(METAL_FRONT)
METAL_EMU_CXXFLAGS := -x c++ -std=c++14 -nostdinc -nostdinc++ -Imetal_emu/include -Xclang -fnative-half-type \
  -Xclang -fnative-half-arguments-and-returns -ffp-contract=off -fno-exceptions -fno-rtti -fsigned-char -O2 -fPIC \
  -fvisibility=hidden -w

.PHONY: metal-emu metal-check-msl metal-emu-mutants test-metal-emu

$(METAL_EMU_CPP): $(METAL_SRC) $(METAL_FRONT) $(wildcard metal_emu/pass1/*) $(DENO_DEP)
	@mkdir -p $(METAL_EMU_DIR)
	$(METAL_FRONT_RUN) --out $@ $(METAL_SRC)

$(METAL_EMU_OBJ): $(METAL_EMU_CPP) $(METAL_EMU_HDR)
	$(CXX_EMU) $(METAL_EMU_CXXFLAGS) -c -o $@ $<

# The C side (core, contracts, backend, runtime) is compiled once into build/metal_emu_c/, so that a
# build from another copy of the MSL (METAL_EMU_DIR, as the mutation check does) compiles only that.
METAL_EMU_C_OBJ := $(patsubst %.c,build/metal_emu_c/%.o,$(subst /,_,$(CORE_SRC) $(METAL_EMU_SRC)))
define METAL_EMU_C_RULE
build/metal_emu_c/$(subst /,_,$(1:.c=.o)): $(1) $(CORE_HDR) $(METAL_EMU_HDR)
	@mkdir -p build/metal_emu_c
	$$(CC) $$(CFLAGS_COMMON) -c -o $$@ $(1)
endef
$(foreach f,$(CORE_SRC) $(METAL_EMU_SRC),$(eval $(call METAL_EMU_C_RULE,$(f))))

$(METAL_EMU_LIB): $(METAL_EMU_C_OBJ) $(METAL_EMU_OBJ)
	$(CC) $(CFLAGS_COMMON) $(SHARED) -o $@ $(METAL_EMU_C_OBJ) $(METAL_EMU_OBJ) -ldl -lm

metal-emu: $(METAL_EMU_LIB)

# The whole suite on the emulated Metal backend.
test-metal-emu: metal-emu native $(DENO_DEP)
	MLXN_BACKEND=metal-emu DENO="$(DENO)" DENO_TEST_FLAGS="$(DENO_TEST_FLAGS)" bash scripts/test.sh

# The MSL part of metal-check: signatures and attributes (front end), then clang++ -fsyntax-only.
metal-check-msl: $(DENO_DEP)
	$(METAL_FRONT_RUN) --check $(METAL_SRC)

# Deliberately broken copies of the MSL (scripts/metal_emu_mutants.ts): each must fail the suite on
# the emulator, after the unbroken copy passed it. MUTANT_TESTS narrows the suite (default tests/).
MUTANT_TESTS ?= tests/
metal-emu-mutants: $(DENO_DEP)
	DENO="$(DENO)" DENO_TEST_FLAGS="$(DENO_TEST_FLAGS)" $(DENO) run --allow-read --allow-write --allow-run \
	  --allow-env scripts/metal_emu_mutants.ts $(MUTANT_TESTS)
