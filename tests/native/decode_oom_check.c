/* The decoder under allocation failure: a stream of TRACK records that grows the conflict tracker's
 * interval sets past many blocks (thousands of gapped slices written, then read: the written bytes are
 * copied out of the touched set; long ranges that merge across blocks; a barrier, then more slices) is
 * encoded on a fresh CPU device with allocation call k failing, for every k until the encode makes no
 * more calls. Each encode must fail with MLXN_E_OUT_OF_MEMORY exactly when a call failed (never a crash
 * or another code); a second command buffer, which takes over the failed one's storage (its tracker
 * among it), must then encode the whole stream. Link with -Wl,--wrap=malloc,--wrap=realloc,--wrap=calloc
 * and the library's C sources (tests/decode_oom_check_test.ts); under ASan every failure path is also
 * checked for leaks. Prints "decode oom: ok N failures" and exits 0, or says what went wrong and exits 1. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../native/core/internal.h"

void *__real_malloc(size_t n);
void *__real_realloc(void *p, size_t n);
void *__real_calloc(size_t count, size_t n);

/* Call number fail_at (counted from 0 while it is set) returns NULL; failed says it happened. */
static long calls, fail_at = -1;
static int failed;
static int fail_now(void) {
  if (fail_at < 0 || calls++ != fail_at) return 0;
  failed = 1;
  return 1;
}
void *__wrap_malloc(size_t n) { return fail_now() ? NULL : __real_malloc(n); }
void *__wrap_realloc(void *p, size_t n) { return fail_now() ? NULL : __real_realloc(p, n); }
void *__wrap_calloc(size_t count, size_t n) { return fail_now() ? NULL : __real_calloc(count, n); }

static uint64_t seed;
static uint32_t next(uint32_t n) {
  seed ^= seed << 13;
  seed ^= seed >> 7;
  seed ^= seed << 17;
  return (uint32_t)(seed % n);
}

#define BYTES 65536u
static uint32_t words[1u << 18], n_words;
static void put(uint32_t w) { words[n_words++] = w; }

/* A TRACK record of n ranges of buffer h: 0 gapped 4-byte slices written; 1 short reads; 2 long
 * ranges, read or written. */
static void track(uint32_t h, uint32_t n, int style, uint32_t check) {
  put(MLXN_OP_TRACK | ((MLXN_REC_TRACK_HEADER_WORDS + MLXN_REC_TRACK_ENTRY_WORDS * n) << 16));
  for (uint32_t i = 0; i < n; i++) {
    uint64_t off, len;
    uint32_t flags;
    if (style == 0) {
      off = (uint64_t)next(BYTES / 8) * 8, len = 4, flags = MLXN_TRACK_WRITE;
    } else if (style == 1) {
      off = next(BYTES - 64), len = 1 + next(16), flags = MLXN_TRACK_READ;
    } else {
      off = next(BYTES - 4096), len = 1 + next(4096), flags = next(2) ? MLXN_TRACK_WRITE : MLXN_TRACK_READ;
    }
    put(h), put(flags | check), put((uint32_t)off), put((uint32_t)(off >> 32)), put((uint32_t)len), put(0);
  }
}

static void build(uint32_t a, uint32_t b) {
  seed = 88172645463325252ull;
  n_words = 0;
  put(MLXN_OP_AUTO_BARRIERS | (1u << 8) | (MLXN_REC_AUTO_BARRIERS_WORDS << 16));
  for (int r = 0; r < 6; r++) track(a, MLXN_MAX_TRACK_ENTRIES, 0, MLXN_TRACK_CHECK);
  for (int r = 0; r < 2; r++) track(b, MLXN_MAX_TRACK_ENTRIES, 0, 0);
  track(a, MLXN_MAX_TRACK_ENTRIES, 1, MLXN_TRACK_CHECK);
  track(b, 512, 2, MLXN_TRACK_CHECK);
  track(a, 256, 2, 0);
  put(MLXN_OP_BARRIER | (MLXN_REC_BARRIER_WORDS << 16));
  for (int r = 0; r < 2; r++) track(a, MLXN_MAX_TRACK_ENTRIES, 0, MLXN_TRACK_CHECK);
}

static int fail(const char *what, long at) {
  char msg[512];
  mlxn_last_error((uint8_t *)msg, sizeof msg);
  printf("decode oom: %s (allocation call %ld failing; last error: %s)\n", what, at, msg);
  return 1;
}

int main(void) {
  long failures = 0;
  for (long at = 0;; at++) {
    mlxn_device *dev = mlxn_device_open(0, 1);
    if (!dev) return fail("no CPU device", at);
    uint32_t a = mlxn_buffer_alloc(dev, BYTES), b = mlxn_buffer_alloc(dev, BYTES);
    mlxn_cmdbuf *cb = mlxn_cmdbuf_new(dev);
    if (!a || !b || !cb) return fail("setup failed", at);
    build(a, b);
    calls = 0, failed = 0, fail_at = at;
    int32_t rc = mlxn_cmdbuf_encode(cb, (const uint8_t *)words, 4 * n_words);
    fail_at = -1;
    if (failed ? rc != MLXN_E_OUT_OF_MEMORY : rc != MLXN_OK) return fail("unexpected result", at);
    if (failed && mlxn_cmdbuf_status(cb) != MLXN_CB_ERROR) return fail("the failed command buffer is not in error", at);
    mlxn_cmdbuf_free(cb);
    /* The next command buffer takes over the failed one's storage. */
    if (!(cb = mlxn_cmdbuf_new(dev))) return fail("setup failed", at);
    if (mlxn_cmdbuf_encode(cb, (const uint8_t *)words, 4 * n_words) != MLXN_OK)
      return fail("a command buffer on recycled storage refused the stream", at);
    mlxn_cmdbuf_free(cb);
    mlxn_device_close(dev);
    if (!failed) break; /* every allocation call of the encode has failed once */
    failures++;
  }
  printf("decode oom: ok %ld failures\n", failures);
  return 0;
}
