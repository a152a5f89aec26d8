/*
 * mlxn.h — the native ABI of mlx-native for Deno.
 *
 * One header, several implementations (native/cpu, native/cuda, objc/ for Metal). The TypeScript
 * side (src/native/abi.ts) mirrors every constant below; tests/abi_sync_test.ts parses this file and
 * fails when the two disagree, so change both together and bump MLXN_ABI_VERSION on any change to a
 * signature, a constant or the stream format.
 *
 * Conventions
 *  - Every function is callable from any thread unless noted. Functions returning int32_t return
 *    MLXN_OK (0) or a negative MLXN_E_* code; the human-readable reason is then available from
 *    mlxn_last_error() on the same thread.
 *  - Handles: devices and command buffers are opaque pointers; buffers and pipelines are uint32_t
 *    handles (0 is never valid). Buffer handles are unique in the process across devices (one used
 *    on the wrong device is refused as such) and carry a generation; a handle slot is retired before
 *    its generation would wrap, so a stale handle is detected instead of aliasing a newer buffer.
 *    (About 4 billion allocations per process exhaust the handles; alloc then fails.)
 *  - Nothing reads the process environment: switches arrive through mlxn_device_open flags, so the
 *    host's permission model (Deno --allow-env) stays in charge.
 *
 * Command stream
 *  Dispatches are not one FFI call each. The host writes a little-endian stream of 32-bit words and
 *  hands it over with mlxn_cmdbuf_encode(); one command buffer may receive several chunks, and the
 *  encoder state (pipeline, bindings) carries over from one chunk to the next.
 *
 *  Every record starts with one header word: bits 0..7 = opcode, bits 8..15 = argument slot (or
 *  threadgroup-memory index; 0 for other records), bits 16..31 = record length in words, header
 *  included. Fixed-size records must have exactly their MLXN_REC_*_WORDS length.
 *
 *    SET_PIPELINE      [hdr, pipeline]                                              2 words
 *    SET_BUFFER        [hdr, buffer, offset, length]                                4 words
 *    SET_BUFFER64      [hdr, buffer, offset_lo, offset_hi, length_lo, length_hi]    6 words
 *                      binds bytes [offset, offset+length) of a buffer at the header's slot; a
 *                      kernel never sees more. SET_BUFFER64 is for views beyond 4 GiB.
 *    SET_BUFFER_WHOLE  [hdr, buffer]                                                2 words
 *                      binds a whole buffer (offset 0, its full size): the common case, half
 *                      the words of SET_BUFFER.
 *    SET_BYTES         [hdr, nbytes, data…]   data padded to a whole word; nbytes ≤ MLXN_MAX_INLINE_BYTES
 *                      inline constants for the header's slot, copied into the command buffer.
 *    SET_TG_MEMORY     [hdr, nbytes]          threadgroup memory for the header's index    2 words
 *    DISPATCH_THREADS  [hdr, grid x,y,z, threadgroup x,y,z, tag]   grid counts threads    8 words
 *    DISPATCH_GROUPS   [hdr, groups x,y,z, threadgroup x,y,z, tag] grid counts groups     8 words
 *                      tag: an opaque value (the host's dispatch index) echoed in timings. Every
 *                      dispatch consumes the bindings set since the previous one: each dispatch
 *                      carries its complete binding set; the pipeline stays set.
 *    BARRIER           [hdr]                                                        1 word
 *                      every dispatch after it sees all memory written before it.
 *    AUTO_BARRIERS     [hdr]   slot field 1 = on, 0 = off                           1 word
 *                      with it on, the decoder places barriers itself: before a dispatch whose
 *                      accesses conflict with its concurrent group it starts a new group exactly as
 *                      a BARRIER would. A dispatch's accesses are its bound buffer slots' byte ranges,
 *                      read and/or written as the kernel's contract declares (zero-length ranges
 *                      touch nothing). Conflict: a read of a byte the group wrote (RAW), a write of a
 *                      byte the group read or wrote (WAR, WAW); read–read and different buffers never.
 *                      No barrier goes before a command buffer's first dispatch. Every BARRIER record
 *                      (also one before the first dispatch) forgets the group; switching AUTO_BARRIERS
 *                      does not (dispatches encoded while it is off are not added to the group).
 *    TRACK             [hdr, n × {buffer, flags, offset_lo, offset_hi, length_lo, length_hi}]
 *                      1 + 6n words, 1 <= n <= MLXN_MAX_TRACK_ENTRIES, slot field 0. Ranges given by
 *                      the host (barrier_between / track_dispatch), tracked whether AUTO_BARRIERS is
 *                      on or off: flags MLXN_TRACK_READ and/or MLXN_TRACK_WRITE per entry, and
 *                      MLXN_TRACK_CHECK set in every entry or in none. With CHECK, if any range
 *                      conflicts with the group and the command buffer has a dispatch, a new group
 *                      starts first; then every range joins the group. Each buffer must be live on
 *                      this device and [offset, offset+length) inside it; the command buffer keeps
 *                      a reference on it (as on a bound one) until it completes or is freed.
 *
 *  Between two barriers, dispatches form a concurrent group and may run in any order or overlap.
 *  The decoder validates every record against the device and the kernel's signature (slot kinds,
 *  inline sizes, the bytes each bound buffer must hold for the given geometry and constants, with
 *  every size computed in checked 64-bit arithmetic; each binding aligned to its element size; a
 *  matrix product's output not overlapping its inputs; a total threadgroup count that fits 64 bits;
 *  buffers of this device only). On the
 *  first bad record it returns a negative code, stores the record's byte offset (see
 *  mlxn_cmdbuf_error_offset) and leaves the command buffer in the error state; it never crashes.
 */
#ifndef MLXN_H
#define MLXN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MLXN_ABI_VERSION 6

/* ---- status codes ------------------------------------------------------------------------- */
#define MLXN_OK 0
#define MLXN_E_INVALID_ARGUMENT -1   /* bad parameter to an ABI function */
#define MLXN_E_OUT_OF_MEMORY -2      /* allocation failed */
#define MLXN_E_BAD_HANDLE -3         /* unknown, freed or stale buffer/pipeline handle */
#define MLXN_E_STREAM -4             /* malformed command stream (see error offset) */
#define MLXN_E_STATE -5              /* call not allowed in the object's current state */
#define MLXN_E_EXECUTION -6          /* a dispatch failed while running (sticky on its command buffer) */
#define MLXN_E_UNSUPPORTED -7        /* the backend cannot do this */
#define MLXN_E_DEVICE -8             /* no usable device */

/* ---- stream opcodes and record sizes ------------------------------------------------------ */
#define MLXN_OP_SET_PIPELINE 1
#define MLXN_OP_SET_BUFFER 2
#define MLXN_OP_SET_BYTES 3
#define MLXN_OP_SET_TG_MEMORY 4
#define MLXN_OP_DISPATCH_THREADS 5
#define MLXN_OP_DISPATCH_GROUPS 6
#define MLXN_OP_BARRIER 7
#define MLXN_OP_SET_BUFFER64 8
#define MLXN_OP_SET_BUFFER_WHOLE 9
#define MLXN_OP_AUTO_BARRIERS 10
#define MLXN_OP_TRACK 11

#define MLXN_REC_SET_PIPELINE_WORDS 2
#define MLXN_REC_SET_BUFFER_WORDS 4
#define MLXN_REC_SET_BUFFER64_WORDS 6
#define MLXN_REC_SET_BUFFER_WHOLE_WORDS 2
#define MLXN_REC_SET_BYTES_HEADER_WORDS 2
#define MLXN_REC_SET_TG_MEMORY_WORDS 2
#define MLXN_REC_DISPATCH_WORDS 8
#define MLXN_REC_BARRIER_WORDS 1
#define MLXN_REC_AUTO_BARRIERS_WORDS 1
#define MLXN_REC_TRACK_HEADER_WORDS 1
#define MLXN_REC_TRACK_ENTRY_WORDS 6

/* ---- limits (shared by every backend; Metal's are the tightest) --------------------------- */
#define MLXN_MAX_SLOTS 31            /* buffer/bytes argument slots per kernel */
#define MLXN_MAX_INLINE_BYTES 4096   /* setBytes limit */
#define MLXN_MAX_TG_MEMORY 32768     /* threadgroup memory per dispatch, bytes */
#define MLXN_MAX_THREADS_PER_GROUP 1024
#define MLXN_MAX_TG_MEMORY_INDEX 8
#define MLXN_MAX_TRACK_ENTRIES 1024  /* ranges in one TRACK record */

/* ---- TRACK entry flags ----------------------------------------------------------------------- */
#define MLXN_TRACK_READ 1
#define MLXN_TRACK_WRITE 2
#define MLXN_TRACK_CHECK 4

/* ---- mlxn_cmdbuf_barrier_stats: indices of its first words --------------------------------- */
#define MLXN_STAT_DISPATCHES 0       /* dispatches encoded */
#define MLXN_STAT_GROUPS 1           /* barrier-separated groups, the open one included */
#define MLXN_STAT_AUTO_BARRIERS 2    /* barriers the decoder placed (AUTO_BARRIERS, TRACK with CHECK) */
#define MLXN_STAT_AUTO_CONCURRENT 3  /* tracked dispatches and checked TRACKs that needed none */
#define MLXN_STAT_BARRIERS 4         /* every barrier after the first dispatch: BARRIER records and placed ones */
#define MLXN_STAT_OPEN_GROUP 5       /* dispatches in the open group */
#define MLXN_STAT_COUNT 6
#define MLXN_STAT_SMALL_SIZES 64     /* group sizes counted one by one below this */

/* ---- device open flags --------------------------------------------------------------------- */
#define MLXN_FLAG_SERIAL 1           /* MLXN_CONCURRENCY=0: an implicit barrier after every dispatch */
#define MLXN_FLAG_NO_GRAPHS 2        /* CUDA: plain in-order stream launches instead of CUDA graphs */
#define MLXN_FLAG_NO_PDL 4           /* CUDA: graph edges wait for completion (no programmatic launch) */
#define MLXN_FLAG_DISPATCH_TIMING 8  /* profiling: time every dispatch (the CPU backend always does) */

/* ---- command buffer status ----------------------------------------------------------------- */
#define MLXN_CB_ENCODING 0
#define MLXN_CB_COMMITTED 1
#define MLXN_CB_COMPLETED 2
#define MLXN_CB_ERROR 3

/* ---- live-object counters (mlxn_live_objects) ---------------------------------------------- */
#define MLXN_LIVE_DEVICES 0
#define MLXN_LIVE_BUFFERS 1          /* including buffers whose free is deferred */
#define MLXN_LIVE_BUFFER_BYTES 2
#define MLXN_LIVE_CMDBUFS 3
#define MLXN_LIVE_COUNT 4

#if defined(_WIN32)
#define MLXN_API __declspec(dllexport)
#else
#define MLXN_API __attribute__((visibility("default")))
#endif

typedef struct mlxn_device mlxn_device;
typedef struct mlxn_cmdbuf mlxn_cmdbuf;

/* ABI version of this library; the host refuses a library whose version differs from its own. */
MLXN_API uint32_t mlxn_abi_version(void);

/* Copies the calling thread's last error message (NUL-terminated, truncated to cap) into buf and
 * returns its full length in bytes without the NUL. */
MLXN_API uint32_t mlxn_last_error(uint8_t *buf, uint32_t cap);

/* Opens the backend's device. threads = worker threads (0 = one per core; CPU backend only).
 * Returns NULL on failure (see mlxn_last_error). */
MLXN_API mlxn_device *mlxn_device_open(uint32_t flags, uint32_t threads);

/* Waits for every committed command buffer, then frees the device and every buffer still alive on
 * it. Command buffers still alive are detached, not freed: their status, error and timings stay
 * readable and mlxn_cmdbuf_wait returns at once (a committed one has completed; one never committed
 * is in the error state, MLXN_E_STATE), encode and commit fail with MLXN_E_STATE, and the host still
 * releases each with mlxn_cmdbuf_free. Detached ones no longer count in MLXN_LIVE_CMDBUFS. */
MLXN_API void mlxn_device_close(mlxn_device *dev);

/* Writes a JSON object describing the device ({"backend","name","threads","maxThreadsPerGroup",
 * "maxThreadgroupMemory","unifiedMemory",…}) into buf; returns its full length. */
MLXN_API uint32_t mlxn_device_info(mlxn_device *dev, uint8_t *buf, uint32_t cap);

/* Allocates a zero-filled buffer of nbytes (> 0). Returns its handle, or 0 on failure. */
MLXN_API uint32_t mlxn_buffer_alloc(mlxn_device *dev, uint64_t nbytes);

/* Releases a buffer. If a command buffer that binds it has not completed yet, the memory is freed
 * when the last such command buffer completes; the handle is invalid from now on either way. */
MLXN_API int32_t mlxn_buffer_free(mlxn_device *dev, uint32_t buffer);

/* Host pointer to the buffer's bytes for unified-memory backends, NULL otherwise. */
MLXN_API void *mlxn_buffer_contents(mlxn_device *dev, uint32_t buffer);

/* Copies len bytes between host memory and [offset, offset+len) of the buffer. */
MLXN_API int32_t mlxn_buffer_write(mlxn_device *dev, uint32_t buffer, uint64_t offset, const uint8_t *src,
                          uint64_t len);
MLXN_API int32_t mlxn_buffer_read(mlxn_device *dev, uint32_t buffer, uint64_t offset, uint8_t *dst,
                         uint64_t len);

/* Looks a kernel up by name (NUL-terminated). Returns its pipeline handle, or 0 if unknown. */
MLXN_API uint32_t mlxn_pipeline_get(mlxn_device *dev, const uint8_t *name);

/* Writes the pipeline's signature: one character per argument slot, 'b' = buffer, 'c' = inline
 * bytes, '-' = unused; returns its length. */
MLXN_API uint32_t mlxn_pipeline_signature(mlxn_device *dev, uint32_t pipeline, uint8_t *buf, uint32_t cap);

/* A new, empty command buffer in the ENCODING state. NULL on failure. */
MLXN_API mlxn_cmdbuf *mlxn_cmdbuf_new(mlxn_device *dev);

/* Decodes and validates one chunk of the command stream (len bytes, a multiple of 4). */
MLXN_API int32_t mlxn_cmdbuf_encode(mlxn_cmdbuf *cb, const uint8_t *stream, uint32_t len);

/* Copies what `from` decoded into cb, as if from's stream had been encoded into cb, without
 * decoding or validating it again: encode a pass once into a command buffer that is never committed
 * (a template) and replay it into a new command buffer per run. `from` must be a command buffer of
 * the same device, encoding and ended after a dispatch record; cb must have nothing encoded yet.
 * Every buffer `from` binds must still be live (a template references them, like any uncommitted
 * command buffer: freeing one defers its memory until the template is freed). A dispatch encoded
 * into cb after the replay starts a new concurrent group; automatic barriers are on for it if they
 * were on at the end of `from`. A refused replay leaves cb failed, like a refused
 * mlxn_cmdbuf_encode chunk: it can no longer be committed or encoded into. */
MLXN_API int32_t mlxn_cmdbuf_replay(mlxn_cmdbuf *cb, mlxn_cmdbuf *from);

/* Words per entry of a patch list: {dispatch index, slot, byte offset, value}. */
#define MLXN_PATCH_WORDS 4

/* mlxn_cmdbuf_replay, then the inline constants changed by a patch list of n_words words: each entry
 * writes one 32-bit value at a 4-aligned byte offset into the inline bytes bound at `slot` of
 * dispatch `dispatch` (an index into the replayed dispatches), and every patched dispatch is
 * validated again against its kernel's contract. A bad entry or a dispatch the new constants make
 * invalid fails the command buffer, as a bad stream would. */
MLXN_API int32_t mlxn_cmdbuf_replay_patched(mlxn_cmdbuf *cb, mlxn_cmdbuf *from, const uint32_t *patch,
                                            uint32_t n_words);

/* mlxn_cmdbuf_encode of a whole pass (len bytes) into an empty command buffer that then keeps a copy
 * of the stream: a template for mlxn_cmdbuf_replay_like. It takes nothing more (no encode, no
 * commit); replay it with any of the replay functions, free it with mlxn_cmdbuf_free. */
MLXN_API int32_t mlxn_cmdbuf_encode_template(mlxn_cmdbuf *cb, const uint8_t *stream, uint32_t len);

/* Returned by mlxn_cmdbuf_replay_like when the stream is not like the template's: nothing was done. */
#define MLXN_UNLIKE 1

/* Encodes a whole pass (len bytes) into the empty cb as mlxn_cmdbuf_encode would, by replaying
 * template `from` (mlxn_cmdbuf_encode_template) when the stream differs from from's only in values a
 * replay can patch: inline-constant words and the offset and length of SET_BUFFER / SET_BUFFER64
 * bindings. Each patched dispatch is validated again (a binding against its buffer, the dispatch
 * against its kernel's contract); where automatic barriers placed from's barriers, a changed range
 * must not conflict with its concurrent group, and a stream with TRACK records or
 * AUTO_BARRIERS switched after its first dispatch keeps its ranges. Returns MLXN_OK (replayed),
 * MLXN_UNLIKE (any other difference, or too many to be cheaper than decoding: cb is untouched;
 * encode the stream instead) or an error, which fails cb like a refused mlxn_cmdbuf_replay. */
MLXN_API int32_t mlxn_cmdbuf_replay_like(mlxn_cmdbuf *cb, mlxn_cmdbuf *from, const uint8_t *stream, uint32_t len);

/* An entry of mlxn_key_compare's map: an inline-constant word whose value no records word takes. */
#define MLXN_KEY_FREE 4294967294

/* A plan-cache key comparison: whether the stream words of a recorded pass (`now`) equal the key's
 * (`key`), n_words each, everywhere but at inline-constant values. Bit i % 32 of constants[i / 32]
 * (ceil(n_words / 32) words) marks word i as a constant's value; for such a word, map[i] (n_words
 * words; the others are never read) is MLXN_KEY_FREE or the index t of the word of `records`
 * (n_records words) that takes its value, and value_at[t] (n_records words) the index in `patch`
 * (n_patch words) of that word's value in a template's patch list, or -1 when it has none. Returns
 * MLXN_UNLIKE when a word that is not a constant differs (nothing written). Else copies every
 * constant that differs into key and, where the map names a records word t, into records[t] and
 * patch[value_at[t]] (with an entry) or lists t in changed[0..*n_changed) (without one, in key
 * order; changed holds cap words: size it to the key's constant words), and returns MLXN_OK. A map
 * or value_at entry out of range, or a full changed list, is an error (the constants before it
 * copied and listed, none after). Every pointer must be 4-byte aligned; no device is involved. */
MLXN_API int32_t mlxn_key_compare(const uint32_t *now, uint32_t *key, uint32_t n_words, const uint32_t *constants,
                                  const uint32_t *map, uint32_t *records, uint32_t n_records, const int32_t *value_at,
                                  uint32_t *patch, uint32_t n_patch, uint32_t *changed, uint32_t cap,
                                  uint32_t *n_changed);

/* Byte offset, within the chunk, of the record that made the last mlxn_cmdbuf_encode fail. */
MLXN_API uint32_t mlxn_cmdbuf_error_offset(mlxn_cmdbuf *cb);

/* Submits the command buffer to the device's queue; command buffers run in commit order. */
MLXN_API int32_t mlxn_cmdbuf_commit(mlxn_cmdbuf *cb);

/* Blocks until the command buffer has completed (or failed). Returns MLXN_OK or the sticky error.
 * Safe to call from a thread other than the one that committed. */
MLXN_API int32_t mlxn_cmdbuf_wait(mlxn_cmdbuf *cb);

/* One of MLXN_CB_*. */
MLXN_API int32_t mlxn_cmdbuf_status(mlxn_cmdbuf *cb);

/* Copies the command buffer's error text (empty when none) into buf; returns its full length. */
MLXN_API uint32_t mlxn_cmdbuf_error(mlxn_cmdbuf *cb, uint8_t *buf, uint32_t cap);

/* Number of dispatches encoded so far. */
MLXN_API uint32_t mlxn_cmdbuf_dispatch_count(mlxn_cmdbuf *cb);

/* After completion: out[0] = start, out[1] = end of execution in ns (backend clock); then, for up
 * to (cap-2)/3 dispatches: tag, start, end. Returns the number of dispatch entries written;
 * dispatches without timing report start = end = 0. */
MLXN_API uint32_t mlxn_cmdbuf_timings(mlxn_cmdbuf *cb, uint64_t *out, uint32_t cap);

/* The command buffer's barrier statistics, in any state: out[MLXN_STAT_*] (MLXN_STAT_COUNT words;
 * counters saturate at UINT32_MAX), then MLXN_STAT_SMALL_SIZES words, out[MLXN_STAT_COUNT + k] = the
 * closed groups of exactly k dispatches (k = 0 stays 0), then the size of every closed group of
 * MLXN_STAT_SMALL_SIZES or more dispatches, in order. Writes at most cap words and returns how many
 * the whole answer takes: call again with more room when that exceeds cap. 0 for a NULL argument. */
MLXN_API uint32_t mlxn_cmdbuf_barrier_stats(mlxn_cmdbuf *cb, uint32_t *out, uint32_t cap);

/* Frees the command buffer. A committed one is waited for first; an uncommitted one is dropped
 * without running, releasing every buffer it bound. */
MLXN_API void mlxn_cmdbuf_free(mlxn_cmdbuf *cb);

/* Process-wide live-object counts: out[MLXN_LIVE_*]; returns the number written (0 when out is NULL). */
MLXN_API uint32_t mlxn_live_objects(uint64_t *out, uint32_t cap);

#ifdef __cplusplus
}
#endif

#endif /* MLXN_H */
