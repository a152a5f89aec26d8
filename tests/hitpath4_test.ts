/**
 * The plan cache's native key comparison (`mlxn_key_compare`) against a plain reference loop, every
 * refusal it makes, and the patched replay's validation order; then plan-cache hits whose templates
 * are dropped natively between passes, against passes without the cache.
 */
import { deepStrictEqual, equal, match, ok } from "node:assert/strict";
import { DType, GraphExecutor, type MlxBuffer, type MlxDevice } from "../mod.ts";
import { dropTemplatesBinding } from "../src/command_template.ts";
import { KEY_FREE, PATCH_WORDS, Status, UNLIKE } from "../src/native/abi.ts";
import { lastErrorText } from "../src/native/status.ts";
import { type PlanRecords, PlanTemplate } from "../src/plan_cache.ts";
import { rng, testContext } from "./helpers.ts";
import { rawCommandBuffer, RawWords } from "./raw_stream.ts";

/** The arrays of one comparison; `run` calls the native function on copies it returns. */
interface Case {
  now: Uint32Array;
  key: Uint32Array;
  constants: Uint32Array;
  map: Uint32Array;
  records: Uint32Array;
  valueAt: Int32Array;
  patch: Uint32Array;
  cap: number;
}

interface Outcome {
  rc: number;
  key: Uint32Array;
  records: Uint32Array;
  patch: Uint32Array;
  changed: number[];
}

function isConstant(c: Uint32Array, k: number): boolean {
  return ((c[k >>> 5]! >>> (k & 31)) & 1) === 1;
}

/** The comparison as the header specifies it, one word at a time. */
function reference(c: Case): Outcome {
  const key = c.key.slice(), records = c.records.slice(), patch = c.patch.slice(), changed: number[] = [];
  const out = (rc: number) => ({ rc, key, records, patch, changed });
  for (let k = 0; k < key.length; k++) {
    if (c.now[k] !== key[k] && !isConstant(c.constants, k)) return out(UNLIKE);
  }
  for (let k = 0; k < key.length; k++) {
    const v = c.now[k]!;
    if (v === key[k]) continue;
    const t = c.map[k]!;
    if (t !== KEY_FREE) {
      if (t >= records.length) return out(Status.E_INVALID_ARGUMENT);
      const p = c.valueAt[t]!;
      if (p >= 0 && p >= patch.length) return out(Status.E_INVALID_ARGUMENT);
      if (p < 0 && changed.length === c.cap) return out(Status.E_INVALID_ARGUMENT);
      if (p >= 0) patch[p] = v;
      else changed.push(t);
      records[t] = v;
    }
    key[k] = v;
  }
  return out(Status.OK);
}

function native(device: MlxDevice, c: Case): Outcome {
  const key = c.key.slice(), records = c.records.slice(), patch = c.patch.slice();
  const changed = new Uint32Array(c.cap), n = new Uint32Array(1);
  const rc = device.sym.mlxn_key_compare(
    c.now,
    key,
    key.length,
    c.constants,
    c.map,
    records,
    records.length,
    c.valueAt,
    patch,
    patch.length,
    changed,
    c.cap,
    n,
  );
  return { rc, key, records, patch, changed: [...changed.subarray(0, n[0]!)] };
}

/** A random case: `n` words, constants in runs, a share of them changed, sites and slots at random. */
function randomCase(rand: () => number, n: number, changes: number, fixedChange: boolean): Case {
  const key = Uint32Array.from({ length: n }, () => (rand() * 2 ** 32) >>> 0), now = key.slice();
  const constants = new Uint32Array((n + 31) >>> 5), nRecords = Math.max(1, n >> 1), nPatch = Math.max(1, n >> 2);
  const map = new Uint32Array(n), constantWords: number[] = [];
  for (let k = 0; k < n; k++) {
    if (rand() < 0.3) {
      constants[k >>> 5]! |= 1 << (k & 31);
      constantWords.push(k);
    }
    map[k] = rand() < 0.1 ? KEY_FREE : Math.floor(rand() * nRecords);
  }
  for (let i = 0; i < changes && constantWords.length > 0; i++) {
    const k = constantWords[Math.floor(rand() * constantWords.length)]!;
    now[k] = (now[k]! + 1 + Math.floor(rand() * 1000)) >>> 0;
  }
  if (fixedChange) {
    const k = Math.floor(rand() * n);
    if (!isConstant(constants, k)) now[k] = now[k]! ^ 4;
  }
  const valueAt = Int32Array.from({ length: nRecords }, () => (rand() < 0.4 ? -1 : Math.floor(rand() * nPatch)));
  return {
    now,
    key,
    constants,
    map,
    records: Uint32Array.from({ length: nRecords }, (_, i) => i),
    valueAt,
    patch: new Uint32Array(nPatch),
    cap: constantWords.length,
  };
}

Deno.test("mlxn_key_compare agrees with the reference: equal, changed constants, a fixed word, chunks and tails", () => {
  using ctx = testContext();
  const rand = rng(4242);
  let hits = 0, unlike = 0, listed = 0;
  // Lengths across 64-word blocks, tails, and past one 65,536-word chunk (two passes).
  for (const n of [0, 1, 31, 63, 64, 65, 127, 1000, 4097, 65536, 65600, 140000]) {
    for (
      const [changes, fixed] of [[0, false], [1, false], [Math.ceil(n / 50), false], [3, true], [n, false]] as const
    ) {
      const c = randomCase(rand, n, changes, fixed);
      const want = reference(c), got = native(ctx.device, c);
      deepStrictEqual(got, want, `${n} words, ${changes} changes${fixed ? " and a fixed word" : ""}`);
      if (got.rc === Status.OK) hits++;
      if (got.rc === UNLIKE) unlike++;
      listed += got.changed.length;
    }
  }
  ok(hits > 30 && unlike > 5 && listed > 1000, `${hits} hits, ${unlike} unlike, ${listed} listed`);
});

Deno.test("mlxn_key_compare: a pass that differs outside the constants writes nothing, even after changed constants", () => {
  using ctx = testContext();
  const n = 300, c = randomCase(rng(7), n, 0, false);
  c.valueAt.fill(-1);
  c.cap = n;
  for (let k = 0; k < n; k++) c.constants[k >>> 5]! |= k < 200 ? 1 << (k & 31) : 0;
  for (let k = 0; k < 200; k++) c.now[k] = c.now[k]! + 1; // every constant changed ...
  c.now[290] = c.now[290]! + 1; // ... then a word that is not one
  const got = native(ctx.device, c);
  equal(got.rc, UNLIKE);
  deepStrictEqual([got.key, got.records, got.patch, got.changed], [c.key, c.records, c.patch, []]);
  c.now[290] = c.key[290]!;
  const hit = native(ctx.device, c);
  equal(hit.rc, Status.OK);
  deepStrictEqual(hit.key, c.now, "the key took every constant");
  deepStrictEqual(hit, reference(c));
  ok(hit.changed.length > 100);
});

Deno.test("mlxn_key_compare refuses bad arguments with InvalidArgument and a message that says what is wrong", () => {
  using ctx = testContext();
  const { sym } = ctx.device;
  const w = new Uint32Array(64).fill(5), bits = new Uint32Array(2).fill(0xffffffff), rec = new Uint32Array(8);
  const at = new Int32Array(8).fill(-1), patch = new Uint32Array(8), changed = new Uint32Array(64);
  const n = new Uint32Array(1);
  const odd = (a: ArrayBufferView) => new Uint8Array(new ArrayBuffer(a.byteLength + 4), 1, a.byteLength);
  type Buf = BufferSource | null;
  interface Args {
    now: Buf;
    key: Buf;
    n: number;
    constants: Buf;
    map: Buf;
    records: Buf;
    nRecords: number;
    valueAt: Buf;
    patch: Buf;
    nPatch: number;
    changed: Buf;
    cap: number;
    count: Buf;
  }
  const call = (o: Partial<Args>) => {
    const a: Args = {
      now: w,
      key: w.slice(),
      n: 64,
      constants: bits,
      map: new Uint32Array(64),
      records: rec,
      nRecords: 8,
      valueAt: at,
      patch,
      nPatch: 8,
      changed,
      cap: 64,
      count: n,
      ...o,
    };
    const rc = sym.mlxn_key_compare(
      a.now,
      a.key,
      a.n,
      a.constants,
      a.map,
      a.records,
      a.nRecords,
      a.valueAt,
      a.patch,
      a.nPatch,
      a.changed,
      a.cap,
      a.count,
    );
    return { rc, message: rc === Status.OK || rc === UNLIKE ? "" : lastErrorText(sym) };
  };
  const refused = (o: Partial<Args>, text: RegExp) => {
    const r = call(o);
    equal(r.rc, Status.E_INVALID_ARGUMENT, JSON.stringify(Object.keys(o)));
    match(r.message, text);
  };
  equal(call({}).rc, Status.OK, "the arguments as given are sound");
  refused({ count: null }, /n_changed must point/);
  refused({ count: odd(n) }, /n_changed must point/);
  for (const name of ["now", "key", "constants", "map"] as const) {
    refused({ [name]: null }, /null pass, key, constants or map/);
  }
  refused({ records: null }, /null records or value_at/);
  refused({ valueAt: null }, /null records or value_at/);
  refused({ patch: null }, /null patch array/);
  refused({ changed: null }, /null changed list/);
  for (const name of ["now", "key", "constants", "map", "records", "valueAt", "patch", "changed"] as const) {
    refused({ [name]: odd(w) }, /4-byte aligned/);
  }
  // Nothing to read: null arrays of no words are fine.
  equal(call({ n: 0, now: null, key: null, constants: null, map: null }).rc, Status.OK);
  // Entries out of range, found where a constant changed: the constants before it are taken.
  const now = w.slice();
  now[3] = 9;
  now[7] = 9;
  const key = w.slice(), recs = new Uint32Array(8);
  const map = new Uint32Array(64);
  map[3] = 1;
  map[7] = 8; // past the 8 records words
  const r = call({ now, key, map, records: recs });
  equal(r.rc, Status.E_INVALID_ARGUMENT);
  match(r.message, /key map word 7 names records word 8, but the records hold 8/);
  deepStrictEqual([key[3], key[7], recs[1], n[0]], [9, 5, 9, 1], "word 3 taken and listed, word 7 not");
  const past = new Int32Array(8).fill(-1);
  past[1] = 8; // past the 8 patch words
  map[7] = KEY_FREE;
  match(call({ now, key: w.slice(), map, valueAt: past }).message, /value_at\[1\] = 8 is past the 8-word patch array/);
  match(call({ now, key: w.slice(), map, cap: 0 }).message, /changed list is full/);
});

/** Axpby dispatches 0..n-1 into slices of `out` (alpha i + 1, beta 1, E elements), as raw words. */
function axpbyStream(device: MlxDevice, x: MlxBuffer, out: MlxBuffer, n: number): Uint8Array {
  const f = (v: number) => new Uint32Array(new Float32Array([v]).buffer)[0]!;
  const w = new RawWords().pipeline(device, "axpby_f32");
  for (let i = 0; i < n; i++) {
    w.buffer(0, x, 0, E * 4).buffer(1, x, 0, E * 4).buffer(2, out, i * E * 4, E * 4);
    w.bytes(3, f(i + 1), f(1), E, 0).threads([E, 1, 1], [E, 1, 1]);
  }
  return w.take();
}

const E = 16;
const f32 = (v: number) => new Uint32Array(new Float32Array([v]).buffer)[0]!;

Deno.test("a patched replay validates each dispatch on its final constants, its entries in dispatch order or not", () => {
  using ctx = testContext();
  const { device } = ctx;
  const sym = device.sym, D = 4;
  using x = device.upload(new Float32Array(E).map((_, j) => j));
  using out = device.alloc(D * E * 4, DType.F32);
  const tmpl = rawCommandBuffer(device);
  equal(tmpl.encode(axpbyStream(device, x, out, D)).rc, Status.OK);
  // Entries: {dispatch, slot 3, byte offset, value}; offset 0 is alpha, 8 is n.
  const entry = (k: number, off: number, v: number) => [k, 3, off, v];
  const replay = (entries: number[][]) => {
    const cb = rawCommandBuffer(device), list = Uint32Array.from(entries.flat());
    const rc = sym.mlxn_cmdbuf_replay_patched(cb.ptr, tmpl.ptr, list, list.length);
    if (rc !== Status.OK) {
      const message = lastErrorText(sym);
      cb.free();
      return { rc, message, out: null };
    }
    cb.run();
    return { rc, message: "", out: out.read() };
  };
  const want = (alphas: number[]) =>
    Float32Array.from({ length: D * E }, (_, i) => Math.fround(Math.fround(alphas[(i / E) | 0]! * (i % E)) + i % E));
  // n = 10^6 alone is refused (past the slices); set back to E by a later entry, it is fine.
  const orders = {
    "in order": [entry(0, 0, f32(5)), entry(1, 8, 1e6), entry(1, 8, E), entry(1, 0, f32(7)), entry(3, 0, f32(-2))],
    "out of order": [entry(3, 0, f32(-2)), entry(1, 8, 1e6), entry(0, 0, f32(5)), entry(1, 8, E), entry(1, 0, f32(7))],
  };
  for (const [name, entries] of Object.entries(orders)) {
    const r = replay(entries);
    equal(r.rc, Status.OK, `${name}: ${r.message}`);
    deepStrictEqual(r.out, want([5, 7, 3, -2]), name);
  }
  for (
    const entries of [
      [entry(0, 0, f32(5)), entry(1, 8, 1e6), entry(2, 0, f32(1))], // in order, dispatch 1 left invalid
      [entry(2, 0, f32(1)), entry(1, 8, 1e6), entry(0, 0, f32(5))], // out of order
    ]
  ) {
    const r = replay(entries);
    equal(r.rc, Status.E_STREAM);
    match(r.message, /patched dispatch 1: kernel axpby_f32: .*1000000/);
  }
  match(replay([entry(0, 0, 1), [1, 2, 0, 1]]).message, /slot 2 of kernel axpby_f32 \(dispatch 1\) holds no inline/);
  tmpl.free();
});

Deno.test("plan templates: entries of a list kept in dispatch order, a value changed again patched in place", () => {
  using ctx = testContext();
  const { device } = ctx;
  const D = 5;
  using x = device.upload(new Float32Array(E).map((_, j) => j));
  using out = device.alloc(D * E * 4, DType.F32);
  const bytes = axpbyStream(device, x, out, D), words = new Uint32Array(bytes.buffer);
  const records: PlanRecords = {
    words,
    bytes,
    patches: new Int32Array(0),
    groupSizes: Int32Array.of(D),
    dispatches: D,
    lastPipeline: device.kernels.get("axpby_f32").handle,
    template: null,
    unchangedHits: 0,
    changedWords: 0,
  };
  const template = new PlanTemplate(device, records);
  const alphaWord = (k: number) => 2 + k * 26 + 14; // pipeline record, then 26 words per dispatch
  const alphas = [1, 2, 3, 4, 5];
  for (const [k, v] of [[3, 8], [1, -1], [4, 0.5], [0, 9], [3, 6]] as const) {
    words[alphaWord(k)] = f32(v);
    alphas[k] = v;
    ok(template.wordChanged(alphaWord(k)));
  }
  const [list, n] = template.patchList();
  equal(n, 4 * PATCH_WORDS, "four words changed (one twice)");
  deepStrictEqual([0, 1, 2, 3].map((e) => list[e * PATCH_WORDS]), [0, 1, 3, 4], "in dispatch order");
  const cb = rawCommandBuffer(device);
  equal(device.sym.mlxn_cmdbuf_replay_patched(cb.ptr, template.ptr, list, n), Status.OK);
  cb.run();
  deepStrictEqual(
    out.read(),
    Float32Array.from({ length: D * E }, (_, i) => Math.fround(Math.fround(alphas[(i / E) | 0]! * (i % E)) + i % E)),
  );
  template.dispose();
});

Deno.test("hits whose templates are dropped natively between passes stay exact (dual buffer and one)", () => {
  using ctx = testContext();
  const { device } = ctx;
  const N = 12, rand = rng(99);
  using x = device.upload(new Float32Array(E).map((_, j) => j - 3));
  using y = device.upload(new Float32Array(E).map((_, j) => 1 / (j + 2)));
  using wide = device.alloc(N * E * 4, DType.F32);
  const slices = Array.from({ length: N }, (_, i) => wide.slice(i * E * 4, E * 4));
  for (const options of [{ fuse: true, reorder: true }, { fuse: true, reorder: true, dualBuffer: true }]) {
    const exec = new GraphExecutor(device), plain = new GraphExecutor(device, { planCache: false });
    const pass = (on: GraphExecutor, alphas: number[]) => {
      wide.write(new Float32Array(N * E).fill(0.25));
      const s = on.beginRecorded();
      for (let i = 0; i < N; i++) s.axpby(x, y, slices[i]!, { alpha: alphas[i]!, beta: 1 });
      s.gelu(slices[0]!, slices[0]!);
      const report = s.finish(options);
      return { report, out: wide.read() };
    };
    for (let p = 0; p < 24; p++) {
      // Alphas change every pass (from a small set: words change back too); now and then every
      // template binding x is dropped, as freeing x would (x itself stays).
      const alphas = Array.from({ length: N }, () => [0.5, 2, -1, 3][Math.floor(rand() * 4)]!);
      if (p % 5 === 4) dropTemplatesBinding(device, x.handle);
      const want = pass(plain, alphas).out, got = pass(exec, alphas);
      deepStrictEqual(got.out, want, `${JSON.stringify(options)} pass ${p}`);
      equal(got.report.planCache, p === 0 ? "miss" : "hit");
    }
  }
});

Deno.test("KEY_FREE is the header's MLXN_KEY_FREE", () => {
  const header = Deno.readTextFileSync(new URL("../native/mlxn.h", import.meta.url));
  equal(Number(/^#define MLXN_KEY_FREE (\d+)/m.exec(header)?.[1]), KEY_FREE);
});
