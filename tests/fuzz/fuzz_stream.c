/* libFuzzer target for the command stream: decode, then EXECUTE (make fuzz).
 *
 * A CPU device with four buffers (handles 1..4 of 64 B, 256 B, 4 KiB, 64 KiB) stays open for the
 * whole run. Each input is decoded into a fresh command buffer in two chunks (the first two bytes
 * choose where to split) so that decoder state carried across chunks is exercised too. When the
 * whole stream is accepted, the command buffer is committed and waited for, so every kernel runs
 * with whatever arguments the validation let through: an out-of-bounds access there is a
 * sanitizer report. Streams whose grids would take long to run (more than MAX_THREADGROUPS in
 * all) are freed without running; the validation still saw them. The buffers are zeroed after a
 * run, so an input behaves the same whatever ran before it. Every input must be accepted or
 * refused cleanly: no crash, no sanitizer report, no leak (live command buffers return to zero). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../native/core/internal.h"

#define MAX_THREADGROUPS 512u

static mlxn_device *dev;
static const uint64_t sizes[4] = {64, 256, 4096, 65536};
static int verbose; /* FUZZ_STREAM_VERBOSE=1: say what became of each input (checking the seeds) */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  dev = mlxn_device_open(0, 1);
  if (!dev) abort();
  verbose = getenv("FUZZ_STREAM_VERBOSE") != NULL;
  for (int i = 0; i < 4; i++)
    if (mlxn_buffer_alloc(dev, sizes[i]) != (uint32_t)(i + 1)) abort();
  return 0;
}

/* Whether the decoded command buffer is small enough to run within the fuzzer's pace. */
static int cheap_to_run(const mlxn_cmdbuf *cb) {
  uint64_t total = 0;
  for (uint32_t i = 0; i < cb->n_dispatches; i++) {
    total += cb->dispatches[i].tg_total;
    if (total > MAX_THREADGROUPS) return 0;
  }
  return cb->n_dispatches > 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2 || size > (1u << 20)) return 0;
  uint32_t body = (uint32_t)(size - 2);
  uint32_t split = ((uint32_t)data[0] | ((uint32_t)data[1] << 8)) % (body + 1);
  split &= ~3u; /* chunks are whole words; a misaligned total still reaches the length check */
  mlxn_cmdbuf *cb = mlxn_cmdbuf_new(dev);
  if (!cb) abort();
  int ok = mlxn_cmdbuf_encode(cb, data + 2, split) == MLXN_OK &&
           mlxn_cmdbuf_encode(cb, data + 2 + split, body - split) == MLXN_OK;
  if (verbose && !ok) {
    char msg[1024];
    mlxn_last_error((uint8_t *)msg, sizeof msg);
    fprintf(stderr, "refused: %s\n", msg);
  }
  /* The barrier statistics, whatever the outcome: into a short array first (a partial answer),
   * then in full; every group is counted once. */
  uint32_t head[8], full[MLXN_STAT_COUNT + MLXN_STAT_SMALL_SIZES + 64];
  uint32_t total = mlxn_cmdbuf_barrier_stats(cb, head, 8);
  if (total < MLXN_STAT_COUNT + MLXN_STAT_SMALL_SIZES) abort();
  if (total <= sizeof full / sizeof full[0] && mlxn_cmdbuf_barrier_stats(cb, full, total) == total) {
    uint64_t counted = full[MLXN_STAT_OPEN_GROUP], groups = full[MLXN_STAT_OPEN_GROUP] > 0;
    for (uint32_t k = 1; k < MLXN_STAT_SMALL_SIZES; k++) {
      counted += (uint64_t)k * full[MLXN_STAT_COUNT + k];
      groups += full[MLXN_STAT_COUNT + k];
    }
    for (uint32_t i = MLXN_STAT_COUNT + MLXN_STAT_SMALL_SIZES; i < total; i++, groups++) counted += full[i];
    if (ok && (counted != full[MLXN_STAT_DISPATCHES] || groups != full[MLXN_STAT_GROUPS])) abort();
  }
  if (verbose && ok)
    fprintf(stderr, "accepted: %u dispatches in %u groups (%u barriers placed), %s\n", cb->n_dispatches,
            head[MLXN_STAT_GROUPS], head[MLXN_STAT_AUTO_BARRIERS], cheap_to_run(cb) ? "runs" : "not run");
  if (ok && cheap_to_run(cb)) {
    if (mlxn_cmdbuf_commit(cb) != MLXN_OK) abort(); /* an accepted stream must commit */
    int32_t rc = mlxn_cmdbuf_wait(cb);
    int32_t status = mlxn_cmdbuf_status(cb);
    /* Success, or a dispatch that failed on its data (debug_fault, an out-of-range expert id). */
    if (!(rc == MLXN_OK && status == MLXN_CB_COMPLETED) && !(rc == MLXN_E_EXECUTION && status == MLXN_CB_ERROR))
      abort();
    if (verbose) fprintf(stderr, "ran: rc %d\n", rc);
    uint64_t t[2 + 3 * 4];
    mlxn_cmdbuf_timings(cb, t, sizeof t / sizeof t[0]);
    for (uint32_t h = 1; h <= 4; h++) memset(mlxn_buffer_contents(dev, h), 0, (size_t)sizes[h - 1]);
  }
  mlxn_cmdbuf_free(cb);
  uint64_t live[MLXN_LIVE_COUNT];
  mlxn_live_objects(live, MLXN_LIVE_COUNT);
  if (live[MLXN_LIVE_CMDBUFS] != 0) abort(); /* a leaked command buffer */
  if (live[MLXN_LIVE_BUFFERS] != 4) abort(); /* a lost or leaked buffer reference */
  return 0;
}
