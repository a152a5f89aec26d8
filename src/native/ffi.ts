/**
 * The native symbol table: every function of native/mlxn.h with its C signature. Parameter types
 * stay on V8's fast-call path (pointer, buffer, u32/i32; 64-bit values as BigInt). Waits have a
 * `nonblocking` twin for async completion.
 *
 * @module
 */

/** Every symbol of the native ABI. */
export const symbols = {
  /** uint32_t mlxn_abi_version(void) */
  mlxn_abi_version: { parameters: [], result: "u32" },
  /** uint32_t mlxn_last_error(uint8_t *buf, uint32_t cap) */
  mlxn_last_error: { parameters: ["buffer", "u32"], result: "u32" },
  /** mlxn_device *mlxn_device_open(uint32_t flags, uint32_t threads) */
  mlxn_device_open: { parameters: ["u32", "u32"], result: "pointer" },
  /** void mlxn_device_close(mlxn_device *dev) */
  mlxn_device_close: { parameters: ["pointer"], result: "void" },
  /** uint32_t mlxn_device_info(mlxn_device *dev, uint8_t *buf, uint32_t cap) */
  mlxn_device_info: { parameters: ["pointer", "buffer", "u32"], result: "u32" },
  /** uint32_t mlxn_buffer_alloc(mlxn_device *dev, uint64_t nbytes) */
  mlxn_buffer_alloc: { parameters: ["pointer", "u64"], result: "u32" },
  /** int32_t mlxn_buffer_free(mlxn_device *dev, uint32_t buffer) */
  mlxn_buffer_free: { parameters: ["pointer", "u32"], result: "i32" },
  /** void *mlxn_buffer_contents(mlxn_device *dev, uint32_t buffer) */
  mlxn_buffer_contents: { parameters: ["pointer", "u32"], result: "pointer" },
  /** int32_t mlxn_buffer_write(dev, uint32_t buffer, uint64_t offset, const uint8_t *src, uint64_t len) */
  mlxn_buffer_write: { parameters: ["pointer", "u32", "u64", "buffer", "u64"], result: "i32" },
  /** int32_t mlxn_buffer_read(dev, uint32_t buffer, uint64_t offset, uint8_t *dst, uint64_t len) */
  mlxn_buffer_read: { parameters: ["pointer", "u32", "u64", "buffer", "u64"], result: "i32" },
  /** uint32_t mlxn_pipeline_get(mlxn_device *dev, const uint8_t *name) */
  mlxn_pipeline_get: { parameters: ["pointer", "buffer"], result: "u32" },
  /** uint32_t mlxn_pipeline_signature(dev, uint32_t pipeline, uint8_t *buf, uint32_t cap) */
  mlxn_pipeline_signature: { parameters: ["pointer", "u32", "buffer", "u32"], result: "u32" },
  /** mlxn_cmdbuf *mlxn_cmdbuf_new(mlxn_device *dev) */
  mlxn_cmdbuf_new: { parameters: ["pointer"], result: "pointer" },
  /** int32_t mlxn_cmdbuf_encode(mlxn_cmdbuf *cb, const uint8_t *stream, uint32_t len) */
  mlxn_cmdbuf_encode: { parameters: ["pointer", "buffer", "u32"], result: "i32" },
  /** int32_t mlxn_cmdbuf_replay(mlxn_cmdbuf *cb, mlxn_cmdbuf *from) */
  mlxn_cmdbuf_replay: { parameters: ["pointer", "pointer"], result: "i32" },
  /** int32_t mlxn_cmdbuf_replay_patched(mlxn_cmdbuf *cb, mlxn_cmdbuf *from, const uint32_t *patch, uint32_t n_words) */
  mlxn_cmdbuf_replay_patched: { parameters: ["pointer", "pointer", "buffer", "u32"], result: "i32" },
  /** int32_t mlxn_cmdbuf_encode_template(mlxn_cmdbuf *cb, const uint8_t *stream, uint32_t len) */
  mlxn_cmdbuf_encode_template: { parameters: ["pointer", "buffer", "u32"], result: "i32" },
  /** int32_t mlxn_cmdbuf_replay_like(mlxn_cmdbuf *cb, mlxn_cmdbuf *from, const uint8_t *stream, uint32_t len) */
  mlxn_cmdbuf_replay_like: { parameters: ["pointer", "pointer", "buffer", "u32"], result: "i32" },
  /**
   * int32_t mlxn_key_compare(now, key, uint32_t n_words, constants, map, records, uint32_t n_records,
   * value_at, patch, uint32_t n_patch, changed, uint32_t cap, uint32_t *n_changed)
   */
  mlxn_key_compare: {
    parameters: [
      "buffer",
      "buffer",
      "u32",
      "buffer",
      "buffer",
      "buffer",
      "u32",
      "buffer",
      "buffer",
      "u32",
      "buffer",
      "u32",
      "buffer",
    ],
    result: "i32",
  },
  /** uint32_t mlxn_cmdbuf_error_offset(mlxn_cmdbuf *cb) */
  mlxn_cmdbuf_error_offset: { parameters: ["pointer"], result: "u32" },
  /** int32_t mlxn_cmdbuf_commit(mlxn_cmdbuf *cb) */
  mlxn_cmdbuf_commit: { parameters: ["pointer"], result: "i32" },
  /** int32_t mlxn_cmdbuf_wait(mlxn_cmdbuf *cb) — blocks the calling thread */
  mlxn_cmdbuf_wait: { parameters: ["pointer"], result: "i32" },
  /** the same wait on a background thread: resolves when the command buffer is done */
  mlxn_cmdbuf_wait_async: {
    name: "mlxn_cmdbuf_wait",
    parameters: ["pointer"],
    result: "i32",
    nonblocking: true,
  },
  /** int32_t mlxn_cmdbuf_status(mlxn_cmdbuf *cb) */
  mlxn_cmdbuf_status: { parameters: ["pointer"], result: "i32" },
  /** uint32_t mlxn_cmdbuf_error(mlxn_cmdbuf *cb, uint8_t *buf, uint32_t cap) */
  mlxn_cmdbuf_error: { parameters: ["pointer", "buffer", "u32"], result: "u32" },
  /** uint32_t mlxn_cmdbuf_dispatch_count(mlxn_cmdbuf *cb) */
  mlxn_cmdbuf_dispatch_count: { parameters: ["pointer"], result: "u32" },
  /** uint32_t mlxn_cmdbuf_timings(mlxn_cmdbuf *cb, uint64_t *out, uint32_t cap) */
  mlxn_cmdbuf_timings: { parameters: ["pointer", "buffer", "u32"], result: "u32" },
  /** uint32_t mlxn_cmdbuf_barrier_stats(mlxn_cmdbuf *cb, uint32_t *out, uint32_t cap) */
  mlxn_cmdbuf_barrier_stats: { parameters: ["pointer", "buffer", "u32"], result: "u32" },
  /** void mlxn_cmdbuf_free(mlxn_cmdbuf *cb) */
  mlxn_cmdbuf_free: { parameters: ["pointer"], result: "void" },
  /** uint32_t mlxn_live_objects(uint64_t *out, uint32_t cap) */
  mlxn_live_objects: { parameters: ["buffer", "u32"], result: "u32" },
} as const satisfies Deno.ForeignLibraryInterface;

/** The loaded library's symbols. */
export type NativeSymbols = Deno.DynamicLibrary<typeof symbols>["symbols"];
