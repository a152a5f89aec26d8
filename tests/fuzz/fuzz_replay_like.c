/* libFuzzer target for replays by a like stream (mlxn_cmdbuf_replay_like), differential against the
 * decoder (make fuzz).
 *
 * Input: a u32 (little endian) giving the template stream's length in bytes (taken modulo what is
 * there, rounded down to whole words), the template stream T, then any number of 8-byte mutations
 * {u32 word index, u32 value}: the candidate stream S is T with word (index mod T's words) set to
 * value, in order. Handle words 1..4 in buffer and TRACK records name the four buffers of a CPU
 * device that stays open (64 B, 256 B, 4 KiB, 64 KiB), as in fuzz_stream.c. The length word's top
 * bit picks a serial device instead (MLXN_FLAG_SERIAL: each dispatch a group of its own, while its
 * automatic barriers still follow the tracker's groups).
 *
 * T is made a template (mlxn_cmdbuf_encode_template); S is decoded into one command buffer (A) and
 * replayed like T into another (B). The replay must agree with the decoder:
 *  - replayed (MLXN_OK): S decodes too, into the same dispatches (kernel, contract, geometry, tag,
 *    threadgroup memory, every buffer slot's address, length and object, every inline slot's bytes);
 *    the same concurrent groups, except that under automatic barriers B may keep a barrier the
 *    decoder no longer needs, never lack one it places; B then runs (when cheap) under ASan;
 *  - refused (an error): the decoder refuses S too;
 *  - unlike (MLXN_UNLIKE): B is untouched and takes S as the decoder does.
 * Nothing may leak: live command buffers return to zero, live buffers to four.
 *
 * The same input also checks the plan cache's key comparison (mlxn_key_compare) against a plain
 * reference loop: T's words are the key, S's the pass; T's SET_BYTES data words (as far as its records
 * are well formed) are the constants; their sites, the records' value slots, the list's capacity and
 * where a site points out of range are derived from the words. Status, key, records, patch values
 * and the changed list must be the reference's. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../native/core/internal.h"

#define MAX_THREADGROUPS 512u

static mlxn_device *devs[2]; /* concurrent, serial */
static const uint64_t sizes[4] = {64, 256, 4096, 65536};
static uint32_t dev_handles[2][4]; /* each device's buffers (handles name their device) */
static uint32_t *handles;            /* the input's device's */
static int verbose; /* FUZZ_STREAM_VERBOSE=1: say what became of each input (checking the seeds) */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  verbose = getenv("FUZZ_STREAM_VERBOSE") != NULL;
  for (int d = 0; d < 2; d++) {
    if (!(devs[d] = mlxn_device_open(d ? MLXN_FLAG_SERIAL : 0, 1))) abort();
    for (int i = 0; i < 4; i++)
      if (!(dev_handles[d][i] = mlxn_buffer_alloc(devs[d], sizes[i]))) abort();
  }
  return 0;
}

static uint32_t get_word(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

/* Rewrites stream handles 1..4 to the device's buffers in buffer and TRACK records, as far as the
 * records are well formed. */
static void rename_handles(uint8_t *s, uint32_t len) {
  for (uint32_t off = 0; len - off >= 4;) {
    uint32_t hdr = get_word(s + off), op = hdr & 0xffu, words = hdr >> 16;
    if (words == 0 || words > (len - off) / 4) return;
    uint32_t first = 0, step = 0;
    if (op == MLXN_OP_SET_BUFFER || op == MLXN_OP_SET_BUFFER64 || op == MLXN_OP_SET_BUFFER_WHOLE) first = 1, step = words;
    if (op == MLXN_OP_TRACK) first = 1, step = MLXN_REC_TRACK_ENTRY_WORDS;
    for (uint32_t w = first; step && w < words; w += step) {
      uint32_t h = get_word(s + off + 4 * w);
      if (h >= 1 && h <= 4) memcpy(s + off + 4 * w, &handles[h - 1], 4);
    }
    off += 4 * words;
  }
}

static int cheap_to_run(const mlxn_cmdbuf *cb) {
  uint64_t total = 0;
  for (uint32_t i = 0; i < cb->n_dispatches; i++) {
    total += cb->dispatches[i].tg_total;
    if (total > MAX_THREADGROUPS) return 0;
  }
  return cb->n_dispatches > 0;
}

/* Whether the stream has an AUTO_BARRIERS record (as far as its records are well formed). */
static int has_auto_barriers(const uint8_t *s, uint32_t len) {
  for (uint32_t off = 0; len - off >= 4;) {
    uint32_t hdr = get_word(s + off), words = hdr >> 16;
    if (words == 0 || words > (len - off) / 4) return 0;
    if ((hdr & 0xffu) == MLXN_OP_AUTO_BARRIERS) return 1;
    off += 4 * words;
  }
  return 0;
}

/* Aborts unless a (decoded) and b (replayed) hold the same dispatches in the same groups; with
 * `finer` (automatic barriers), b may keep a barrier a lacks, never lack one. */
static void same_dispatches(const mlxn_cmdbuf *a, const mlxn_cmdbuf *b, int finer) {
  if (a->n_dispatches != b->n_dispatches) abort();
  for (uint32_t k = 0; k < a->n_dispatches; k++) {
    const mlxn_dispatch *x = &a->dispatches[k], *y = &b->dispatches[k];
    if (x->kernel != y->kernel || x->contract != y->contract || x->tag != y->tag || x->tg_total != y->tg_total)
      abort();
    if (memcmp(x->args.grid, y->args.grid, sizeof x->args.grid) || memcmp(x->args.tg, y->args.tg, sizeof x->args.tg) ||
        memcmp(x->args.groups, y->args.groups, sizeof x->args.groups) || x->args.tg_memory != y->args.tg_memory)
      abort();
    const char *sig = x->contract->signature;
    for (uint32_t s = 0; s < MLXN_KERNEL_SLOTS && sig[s]; s++) {
      if (x->args.len[s] != y->args.len[s]) abort();
      if (sig[s] == 'c') {
        if (x->args.len[s] && memcmp(x->args.ptr[s], y->args.ptr[s], (size_t)x->args.len[s])) abort();
      } else if (x->args.ptr[s] != y->args.ptr[s] || x->object[s] != y->object[s]) {
        abort();
      }
    }
    if (k == 0) continue;
    int split_a = x->group != a->dispatches[k - 1].group, split_b = y->group != b->dispatches[k - 1].group;
    if (split_a && !split_b) abort(); /* a barrier the decoder places is missing */
    if (!finer && split_a != split_b) abort();
  }
}

/* mlxn_key_compare as a plain loop over every word: the reference. */
static int32_t ref_key_compare(const uint32_t *now, uint32_t *key, uint32_t n_words, const uint32_t *constants,
                               const uint32_t *map, uint32_t *records, uint32_t n_records, const int32_t *value_at,
                               uint32_t *patch, uint32_t n_patch, uint32_t *changed, uint32_t cap,
                               uint32_t *n_changed) {
  *n_changed = 0;
  for (uint32_t k = 0; k < n_words; k++)
    if (now[k] != key[k] && !((constants[k / 32] >> (k % 32)) & 1u)) return MLXN_UNLIKE;
  uint32_t n = 0;
  for (uint32_t k = 0; k < n_words; k++) {
    if (now[k] == key[k]) continue;
    uint32_t v = now[k], t = map[k];
    if (t != MLXN_KEY_FREE) {
      if (t >= n_records) return *n_changed = n, MLXN_E_INVALID_ARGUMENT;
      int32_t p = value_at[t];
      if (p >= 0 && (uint32_t)p >= n_patch) return *n_changed = n, MLXN_E_INVALID_ARGUMENT;
      if (p < 0 && n == cap) return *n_changed = n, MLXN_E_INVALID_ARGUMENT;
      if (p >= 0) patch[p] = v;
      else changed[n++] = t;
      records[t] = v;
    }
    key[k] = v;
  }
  *n_changed = n;
  return MLXN_OK;
}

/* Runs mlxn_key_compare on key T and pass S (n words) and the reference on copies; aborts on any
 * difference. */
static void check_key_compare(const uint8_t *t, const uint8_t *s, uint32_t n) {
  uint32_t bitmap_words = (n + 31) / 32, n_records = n / 2 + 1, n_patch = n / 4 + 1;
  size_t total = (size_t)6 * n + 2 * n_records + n_patch + bitmap_words + 8;
  uint32_t *mem = calloc(total, 4);
  if (!mem) abort();
  uint32_t *now = mem, *key = now + n, *key2 = key + n, *map = key2 + n, *changed = map + n, *changed2 = changed + n,
           *records = changed2 + n, *records2 = records + n_records, *patch = records2 + n_records,
           *constants = patch + n_patch;
  uint32_t *patch2 = malloc(4 * (size_t)n_patch + 4);
  int32_t *value_at = malloc(4 * (size_t)n_records + 4);
  if (!patch2 || !value_at) abort();
  memcpy(now, s, 4 * (size_t)n);
  memcpy(key, t, 4 * (size_t)n);
  memcpy(key2, t, 4 * (size_t)n);
  uint32_t constant_words = 0;
  for (uint32_t at = 0; at < n;) {
    uint32_t h = key[at], words = h >> 16;
    if (words == 0 || words > n - at) break;
    if ((h & 0xffu) == MLXN_OP_SET_BYTES)
      for (uint32_t k = at + 2; k < at + words; k++) constants[k / 32] |= 1u << (k % 32), constant_words++;
    at += words;
  }
  uint32_t seed = n * 2654435761u;
  for (uint32_t k = 0; k < n; k++) {
    uint32_t h = (key[k] ^ seed) * 2246822519u + k * 3266489917u;
    /* mostly a records word, some free, now and then one past the records */
    map[k] = h % 16 == 0 ? MLXN_KEY_FREE : h % 61 == 0 ? n_records + h % 5 : (h >> 8) % n_records;
  }
  for (uint32_t r = 0; r < n_records; r++) {
    uint32_t h = (r + seed) * 2654435761u;
    value_at[r] = h % 3 == 0 ? -1 : h % 97 == 0 ? (int32_t)(n_patch + h % 3) : (int32_t)((h >> 8) % n_patch);
  }
  uint32_t cap = seed % 7 == 0 ? constant_words / 2 : constant_words;
  memcpy(patch2, patch, 4 * (size_t)n_patch);
  uint32_t got = 0, want = 0;
  int32_t rc = mlxn_key_compare(now, key, n, constants, map, records, n_records, value_at, patch, n_patch, changed,
                                cap, &got);
  int32_t ref = ref_key_compare(now, key2, n, constants, map, records2, n_records, value_at, patch2, n_patch, changed2,
                                cap, &want);
  if (verbose) fprintf(stderr, "key compare: %d (%u listed)\n", rc, got);
  if (rc != ref || got != want || memcmp(key, key2, 4 * (size_t)n) || memcmp(records, records2, 4 * (size_t)n_records) ||
      memcmp(patch, patch2, 4 * (size_t)n_patch) || memcmp(changed, changed2, 4 * (size_t)got))
    abort();
  free(mem);
  free(patch2);
  free(value_at);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4 || size > (1u << 20)) return 0;
  uint32_t avail = (uint32_t)(size - 4), tlen = ((get_word(data) & 0x7fffffffu) % (avail + 1)) & ~3u;
  mlxn_device *dev = devs[get_word(data) >> 31];
  handles = dev_handles[get_word(data) >> 31];
  uint8_t *t = malloc(tlen + 4), *s = malloc(tlen + 4);
  if (!t || !s) abort();
  memcpy(t, data + 4, tlen);
  memcpy(s, t, tlen);
  uint32_t words = tlen / 4;
  for (uint32_t m = 4 + tlen; words && size - m >= 8; m += 8) {
    uint32_t index = get_word(data + m) % words, value = get_word(data + m + 4);
    memcpy(s + 4 * index, &value, 4);
  }
  rename_handles(t, tlen);
  rename_handles(s, tlen);
  check_key_compare(t, s, words);
  mlxn_cmdbuf *tmpl = mlxn_cmdbuf_new(dev), *a = mlxn_cmdbuf_new(dev), *b = mlxn_cmdbuf_new(dev);
  if (!tmpl || !a || !b) abort();
  if (mlxn_cmdbuf_encode_template(tmpl, t, tlen) == MLXN_OK) {
    int32_t ra = mlxn_cmdbuf_encode(a, s, tlen);
    int32_t rb = mlxn_cmdbuf_replay_like(b, tmpl, s, tlen);
    if (verbose)
      fprintf(stderr, "like: %s (decode %s), %u dispatches, %s\n",
              rb == MLXN_OK ? "replayed" : rb == MLXN_UNLIKE ? "unlike" : "refused", ra == MLXN_OK ? "accepts" : "refuses",
              a->n_dispatches, memcmp(t, s, tlen) ? "changed" : "same");
    if (rb == MLXN_OK) {
      if (ra != MLXN_OK) abort(); /* replayed what the decoder refuses */
      same_dispatches(a, b, has_auto_barriers(t, tlen));
      if (cheap_to_run(b)) {
        if (mlxn_cmdbuf_commit(b) != MLXN_OK) abort();
        int32_t rc = mlxn_cmdbuf_wait(b), status = mlxn_cmdbuf_status(b);
        if (!(rc == MLXN_OK && status == MLXN_CB_COMPLETED) && !(rc == MLXN_E_EXECUTION && status == MLXN_CB_ERROR))
          abort();
        for (uint32_t i = 0; i < 4; i++) memset(mlxn_buffer_contents(dev, handles[i]), 0, (size_t)sizes[i]);
      }
    } else if (rb == MLXN_UNLIKE) {
      if (b->n_dispatches || b->n_refs || b->status != MLXN_CB_ENCODING) abort(); /* touched */
      if ((mlxn_cmdbuf_encode(b, s, tlen) == MLXN_OK) != (ra == MLXN_OK)) abort();
    } else if (ra == MLXN_OK) { /* refused what the decoder accepts */
      char msg[1024];
      mlxn_last_error((uint8_t *)msg, sizeof msg);
      fprintf(stderr, "replay_like refused (%d) a stream the decoder accepts: %s\n", rb, msg);
      abort();
    }
  }
  mlxn_cmdbuf_free(tmpl);
  mlxn_cmdbuf_free(a);
  mlxn_cmdbuf_free(b);
  free(t);
  free(s);
  uint64_t live[MLXN_LIVE_COUNT];
  mlxn_live_objects(live, MLXN_LIVE_COUNT);
  if (live[MLXN_LIVE_CMDBUFS] != 0 || live[MLXN_LIVE_BUFFERS] != 8) abort();
  return 0;
}
