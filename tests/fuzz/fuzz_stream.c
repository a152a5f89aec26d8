/* libFuzzer target for the command stream: decode, then EXECUTE (make fuzz).
 *
 * A CPU device with four buffers (64 B, 256 B, 4 KiB, 64 KiB; the stream names them 1..4) stays
 * open for the whole run. Each input is decoded into a fresh command buffer in two chunks so that
 * decoder state carried across chunks (the pending dispatch's bindings, the pipeline, the tracker)
 * is exercised too. The first two bytes choose the split (their low 14 bits) and what the host does
 * between the chunks (their top two bits):
 *   0x4000  buffer 4 is freed and a new 64 KiB buffer takes its name; the freed one is named 6 in the
 *           second chunk (a stale handle there, though a binding of it from the first chunk lives on);
 *   0x8000  a 256 B buffer is allocated (named 5 in the second chunk: the table may grow while the
 *           command buffer is encoding) and freed right after the second chunk, before the commit
 *           (the command buffer's reference must keep its memory alive while the kernels run).
 * Handle words 1..6 in buffer and TRACK records are rewritten to the real handles chunk by chunk;
 * any other value goes to the decoder as it is. When the whole stream is accepted, the command
 * buffer is committed and waited for, so every kernel runs with whatever arguments the validation
 * let through: an out-of-bounds access there is a sanitizer report. Streams whose grids would take
 * long to run (more than MAX_THREADGROUPS in all) are freed without running; the validation still
 * saw them. The buffers are zeroed after a run, so an input behaves the same whatever ran before
 * it. Every input must be accepted or refused cleanly: no crash, no sanitizer report, no leak
 * (live command buffers return to zero, live buffers to four). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../native/core/internal.h"

#define MAX_THREADGROUPS 512u
#define MODE_REPLACE 0x4000u
#define MODE_EXTRA 0x8000u

static mlxn_device *dev;
static const uint64_t sizes[4] = {64, 256, 4096, 65536};
static uint32_t handles[4]; /* the real handles of stream buffers 1..4 */
static int verbose; /* FUZZ_STREAM_VERBOSE=1: say what became of each input (checking the seeds) */

/* The record dictionary beside this file (tests/fuzz/stream.dict: headers of every record kind),
 * unless the command line names one: libFuzzer reads its flags after this hook, so the target
 * brings its own. Skipped when the file is not there (the target run from elsewhere). */
static void add_dictionary(int *argc, char ***argv) {
  static char flag[512];
  static char *args[64];
  for (int i = 1; i < *argc; i++)
    if (strncmp((*argv)[i], "-dict=", 6) == 0) return;
  const char *here = __FILE__, *slash = strrchr(here, '/');
  int dir = slash ? (int)(slash - here) + 1 : 0;
  snprintf(flag, sizeof flag, "-dict=%.*sstream.dict", dir, here);
  FILE *f = fopen(flag + 6, "r");
  if (!f || *argc + 2 > (int)(sizeof args / sizeof args[0])) {
    if (f) fclose(f);
    return;
  }
  fclose(f);
  args[0] = (*argv)[0];
  args[1] = flag;
  for (int i = 1; i < *argc; i++) args[i + 1] = (*argv)[i];
  args[++*argc] = NULL;
  *argv = args;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  add_dictionary(argc, argv);
  dev = mlxn_device_open(0, 1);
  if (!dev) abort();
  verbose = getenv("FUZZ_STREAM_VERBOSE") != NULL;
  for (int i = 0; i < 4; i++)
    if ((handles[i] = mlxn_buffer_alloc(dev, sizes[i])) != (uint32_t)(i + 1)) abort();
  return 0;
}

static uint32_t get_word(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

/* Rewrites stream handle n (1..6) to names[n - 1] (0: left as it is) in one chunk's buffer and
 * TRACK records, as far as the records are well formed. */
static void rename_handles(uint8_t *chunk, uint32_t len, const uint32_t names[6]) {
  for (uint32_t off = 0; len - off >= 4;) {
    uint32_t hdr = get_word(chunk + off), op = hdr & 0xffu, words = hdr >> 16;
    if (words == 0 || words > (len - off) / 4) return;
    uint32_t first = 0, step = 0;
    if (op == MLXN_OP_SET_BUFFER || op == MLXN_OP_SET_BUFFER64 || op == MLXN_OP_SET_BUFFER_WHOLE) first = 1, step = words;
    if (op == MLXN_OP_TRACK) first = 1, step = MLXN_REC_TRACK_ENTRY_WORDS;
    for (uint32_t w = first; step && w < words; w += step) {
      uint32_t h = get_word(chunk + off + 4 * w);
      if (h >= 1 && h <= 6 && names[h - 1]) memcpy(chunk + off + 4 * w, &names[h - 1], 4);
    }
    off += 4 * words;
  }
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
  uint32_t lead = (uint32_t)data[0] | ((uint32_t)data[1] << 8);
  uint32_t split = (lead & 0x3fffu) % (body + 1);
  split &= ~3u; /* chunks are whole words; a misaligned total still reaches the length check */
  uint8_t *stream = malloc(body ? body : 1);
  if (!stream) abort();
  memcpy(stream, data + 2, body);
  uint32_t names[6] = {handles[0], handles[1], handles[2], handles[3], 0, 0};
  rename_handles(stream, split, names);
  mlxn_cmdbuf *cb = mlxn_cmdbuf_new(dev);
  if (!cb) abort();
  int ok = mlxn_cmdbuf_encode(cb, stream, split) == MLXN_OK;
  uint32_t extra = 0;
  if (lead & MODE_REPLACE) { /* freed while the command buffer may hold a binding of it */
    if (mlxn_buffer_free(dev, handles[3]) != MLXN_OK) abort();
    names[5] = handles[3];
    if (!(handles[3] = names[3] = mlxn_buffer_alloc(dev, sizes[3]))) abort();
  }
  if ((lead & MODE_EXTRA) && !(extra = names[4] = mlxn_buffer_alloc(dev, 256))) abort();
  rename_handles(stream + split, body - split, names);
  ok = ok && mlxn_cmdbuf_encode(cb, stream + split, body - split) == MLXN_OK;
  free(stream);
  if (extra && mlxn_buffer_free(dev, extra) != MLXN_OK) abort(); /* the command buffer keeps it */
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
    for (uint32_t i = 0; i < 4; i++) memset(mlxn_buffer_contents(dev, handles[i]), 0, (size_t)sizes[i]);
  }
  mlxn_cmdbuf_free(cb);
  uint64_t live[MLXN_LIVE_COUNT];
  mlxn_live_objects(live, MLXN_LIVE_COUNT);
  if (live[MLXN_LIVE_CMDBUFS] != 0) abort(); /* a leaked command buffer */
  if (live[MLXN_LIVE_BUFFERS] != 4) abort(); /* a lost or leaked buffer reference */
  return 0;
}
