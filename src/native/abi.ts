/**
 * The TypeScript mirror of native/mlxn.h: ABI version, status codes, stream opcodes, record sizes,
 * limits and flags. tests/abi_sync_test.ts checks every entry against the header.
 *
 * @module
 */

/** ABI version this module speaks; a library reporting another version is refused. */
export const ABI_VERSION = 6;

/** Native status codes (MLXN_OK, MLXN_E_*). */
export const Status = {
  OK: 0,
  E_INVALID_ARGUMENT: -1,
  E_OUT_OF_MEMORY: -2,
  E_BAD_HANDLE: -3,
  E_STREAM: -4,
  E_STATE: -5,
  E_EXECUTION: -6,
  E_UNSUPPORTED: -7,
  E_DEVICE: -8,
} as const;

/** What mlxn_cmdbuf_replay_like returns when the stream is not like the template's (MLXN_UNLIKE). */
export const UNLIKE = 1;

/** An entry of mlxn_key_compare's map: a constant whose value no records word takes (MLXN_KEY_FREE). */
export const KEY_FREE = 0xfffffffe;

/** Command-stream opcodes (MLXN_OP_*). */
export const Op = {
  SET_PIPELINE: 1,
  SET_BUFFER: 2,
  SET_BYTES: 3,
  SET_TG_MEMORY: 4,
  DISPATCH_THREADS: 5,
  DISPATCH_GROUPS: 6,
  BARRIER: 7,
  SET_BUFFER64: 8,
  SET_BUFFER_WHOLE: 9,
  AUTO_BARRIERS: 10,
  TRACK: 11,
} as const;

/** Record lengths in 32-bit words, header included (MLXN_REC_*_WORDS). */
export const RecordWords = {
  SET_PIPELINE: 2,
  SET_BUFFER: 4,
  SET_BUFFER64: 6,
  SET_BUFFER_WHOLE: 2,
  SET_BYTES_HEADER: 2,
  SET_TG_MEMORY: 2,
  DISPATCH: 8,
  BARRIER: 1,
  AUTO_BARRIERS: 1,
  TRACK_HEADER: 1,
  TRACK_ENTRY: 6,
} as const;

/** Limits shared by every backend (MLXN_MAX_*). */
export const Limits = {
  MAX_SLOTS: 31,
  MAX_INLINE_BYTES: 4096,
  MAX_TG_MEMORY: 32768,
  MAX_THREADS_PER_GROUP: 1024,
  MAX_TG_MEMORY_INDEX: 8,
  MAX_TRACK_ENTRIES: 1024,
} as const;

/** Words per entry of a replay's patch list (MLXN_PATCH_WORDS): dispatch, slot, byte offset, value. */
export const PATCH_WORDS = 4;

/** Flags of a TRACK record's range (MLXN_TRACK_*). */
export const Track = { READ: 1, WRITE: 2, CHECK: 4 } as const;

/**
 * Word indices of mlxn_cmdbuf_barrier_stats' output (MLXN_STAT_*); after COUNT words come
 * SMALL_SIZES per-size group counts, then the sizes of the wider groups.
 */
export const Stat = {
  DISPATCHES: 0,
  GROUPS: 1,
  AUTO_BARRIERS: 2,
  AUTO_CONCURRENT: 3,
  BARRIERS: 4,
  OPEN_GROUP: 5,
  COUNT: 6,
  SMALL_SIZES: 64,
} as const;

/** Device open flags (MLXN_FLAG_*). */
export const Flag = { SERIAL: 1, NO_GRAPHS: 2, NO_PDL: 4, DISPATCH_TIMING: 8 } as const;

/** Command buffer states (MLXN_CB_*). */
export const CbStatus = { ENCODING: 0, COMMITTED: 1, COMPLETED: 2, ERROR: 3 } as const;

/** Indices of mlxn_live_objects' output (MLXN_LIVE_*). */
export const Live = { DEVICES: 0, BUFFERS: 1, BUFFER_BYTES: 2, CMDBUFS: 3, COUNT: 4 } as const;

/** A record header's opcode (`header & OP_MASK`), slot (`header >>> SLOT_SHIFT & OP_MASK`) and length. */
export const OP_MASK = 0xff;
/** @see OP_MASK */
export const SLOT_SHIFT = 8;
/** Length in words: `header >>> LEN_SHIFT`. */
export const LEN_SHIFT = 16;

/** Whether `op` binds a buffer (SET_BUFFER, SET_BUFFER_WHOLE, SET_BUFFER64; the handle is word 1). */
export function isBufferRecord(op: number): boolean {
  return op === Op.SET_BUFFER || op === Op.SET_BUFFER_WHOLE || op === Op.SET_BUFFER64;
}

/** The header word of a record: opcode in bits 0..7, slot in bits 8..15, length in words in 16..31. */
export function recordHeader(op: number, words: number, slot = 0): number {
  return ((words << 16) | (slot << 8) | op) >>> 0;
}
