/* Runs the probe kernels of semantics.metal through the emulator's runtime and prints each result
 * as one line: `<case> ok <values…>` or `<case> error <reason>`. tests/metal_emu_test.ts builds it
 * and checks the lines. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime.h"

static const mlxn_emu_kernel *find(const char *name) {
  for (const mlxn_emu_kernel *k = mlxn_emu_kernels; k->name; k++)
    if (strcmp(k->name, name) == 0) return k;
  fprintf(stderr, "no kernel %s\n", name);
  exit(2);
}

/* Runs one threadgroup of `threads` threads; prints the first `count` words of buffer 0. */
static void run(mlxn_emu_worker *w, const char *label, const char *kernel, uint32_t threads, uint32_t count,
                int floats, int order, uint8_t fill, void *in1) {
  static uint32_t out[4096];
  mlxn_emu_launch l;
  memset(&l, 0, sizeof l);
  memset(out, 0, sizeof out);
  l.kernel = find(kernel);
  l.buffers[0] = out;
  l.buffers[1] = in1;
  l.tg[0] = threads;
  l.tg[1] = l.tg[2] = 1;
  l.groups[0] = l.groups[1] = l.groups[2] = 1;
  l.tg_memory = 4096;
  char err[384];
  if (mlxn_emu_run_group(w, &l, 0, 0, 0, order, fill, err, sizeof err) != 0) {
    printf("%s error %s\n", label, err);
    return;
  }
  printf("%s ok", label);
  for (uint32_t i = 0; i < count; i++) {
    if (floats) {
      float f;
      memcpy(&f, &out[i], 4);
      printf(" %.9g", f);
    } else {
      printf(" %u", out[i]);
    }
  }
  printf("\n");
}

int main(void) {
  mlxn_emu_worker *w = mlxn_emu_worker_new(1024);
  if (!w) return 2;
  uint16_t halves[2] = {0x3c00u, 0x1000u}; /* 1.0 and 2^-11 */
  run(w, "simd_ops", "simd_ops", 64, 64 * 8, 1, MLXN_EMU_ORDER_FORWARD, 0, NULL);
  run(w, "simd_ops_reverse", "simd_ops", 64, 64 * 8, 1, MLXN_EMU_ORDER_REVERSE, 0, NULL);
  run(w, "simd_ops_partial", "simd_ops", 40, 40 * 8, 1, MLXN_EMU_ORDER_FORWARD, 0, NULL);
  run(w, "simd_partial", "simd_partial", 40, 40 * 4, 1, MLXN_EMU_ORDER_FORWARD, 0, NULL);
  run(w, "simd_inactive", "simd_inactive", 32, 32, 1, MLXN_EMU_ORDER_FORWARD, 0, NULL);
  run(w, "barrier_neighbour", "barrier_neighbour", 100, 100, 0, MLXN_EMU_ORDER_FORWARD, 0, NULL);
  run(w, "barrier_divergent", "barrier_divergent", 64, 64, 0, MLXN_EMU_ORDER_FORWARD, 0, NULL);
  run(w, "simd_divergent", "simd_divergent", 32, 32, 1, MLXN_EMU_ORDER_FORWARD, 0, NULL);
  run(w, "tg_race_forward", "tg_race", 64, 64, 0, MLXN_EMU_ORDER_FORWARD, 0, NULL);
  run(w, "tg_race_reverse", "tg_race", 64, 64, 0, MLXN_EMU_ORDER_REVERSE, 0xff, NULL);
  run(w, "tg_uninit_forward", "tg_uninit", 8, 8, 0, MLXN_EMU_ORDER_FORWARD, 0, NULL);
  run(w, "tg_uninit_reverse", "tg_uninit", 8, 8, 0, MLXN_EMU_ORDER_REVERSE, 0xff, NULL);
  run(w, "numerics", "numerics", 1, 6, 1, MLXN_EMU_ORDER_FORWARD, 0, halves);
  run(w, "builtins", "builtins", 32, 32 * 4, 1, MLXN_EMU_ORDER_FORWARD, 0, NULL);
  float bt[256];
  for (int i = 0; i < 256; i++) bt[i] = (float)(i % 5) - 2.0f; /* B transposed: bt[j * 16 + k] = B[k][j] */
  run(w, "simd_matrix", "simd_matrix", 32, 256, 1, MLXN_EMU_ORDER_FORWARD, 0, bt);
  run(w, "tg_variables", "tg_variables", 64, 65, 1, MLXN_EMU_ORDER_FORWARD, 0, NULL);
  run(w, "tg_variables_reverse", "tg_variables", 64, 65, 1, MLXN_EMU_ORDER_REVERSE, 0xff, NULL);
  mlxn_emu_worker_free(w);
  return 0;
}
