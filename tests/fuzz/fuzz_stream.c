/* libFuzzer target for the command-stream decoder (make fuzz).
 *
 * A device with four buffers (handles 1..4 of 64 B, 256 B, 4 KiB, 64 KiB) stays open for the whole
 * run. Each input is decoded into a fresh command buffer in two chunks (the first two bytes choose
 * where to split) so that decoder state carried across chunks is exercised too; the command buffer is
 * then freed without running. Every input must be accepted or refused cleanly: no crash, no
 * sanitizer report, no leak (live command buffers return to zero). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "../../native/mlxn.h"

static mlxn_device *dev;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  dev = mlxn_device_open(0, 1);
  if (!dev) abort();
  const uint64_t sizes[4] = {64, 256, 4096, 65536};
  for (int i = 0; i < 4; i++)
    if (mlxn_buffer_alloc(dev, sizes[i]) != (uint32_t)(i + 1)) abort();
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2 || size > (1u << 20)) return 0;
  uint32_t body = (uint32_t)(size - 2);
  uint32_t split = ((uint32_t)data[0] | ((uint32_t)data[1] << 8)) % (body + 1);
  split &= ~3u; /* chunks are whole words; a misaligned total still reaches the length check */
  mlxn_cmdbuf *cb = mlxn_cmdbuf_new(dev);
  if (!cb) abort();
  if (mlxn_cmdbuf_encode(cb, data + 2, split) == MLXN_OK) mlxn_cmdbuf_encode(cb, data + 2 + split, body - split);
  mlxn_cmdbuf_free(cb);
  uint64_t live[MLXN_LIVE_COUNT];
  mlxn_live_objects(live, MLXN_LIVE_COUNT);
  if (live[MLXN_LIVE_CMDBUFS] != 0) abort(); /* a leaked command buffer */
  return 0;
}
