/**
 * Hostile review of patched replays: a template's patch list must change exactly what decoding the
 * changed stream changes, nothing else.
 */
import { deepStrictEqual, equal, match } from "node:assert/strict";
import { DType, type MlxDevice } from "../mod.ts";
import { CommandTemplate, StreamRepeats } from "../src/command_template.ts";
import { Op, Status } from "../src/native/abi.ts";
import { lastErrorText } from "../src/native/status.ts";
import { testContext } from "./helpers.ts";
import { rawCommandBuffer, RawWords } from "./raw_stream.ts";

const E = 16;
const f32 = (v: number) => new Uint32Array(new Float32Array([v]).buffer)[0]!;

/** Runs `bytes` decoded, or replayed from `template` with its patch list; returns `out`'s values. */
function run(device: MlxDevice, bytes: Uint8Array, out: { read(): unknown }, template?: CommandTemplate) {
  const cb = rawCommandBuffer(device);
  if (template === undefined) equal(cb.encode(bytes).rc, Status.OK);
  else {
    const [patch, n] = template.patchList();
    const rc = device.sym.mlxn_cmdbuf_replay_patched(cb.ptr, template.ptr, patch, n);
    equal(rc, Status.OK, lastErrorText(device.sym));
  }
  cb.run();
  return Array.from(out.read() as Float32Array);
}

Deno.test("a changed word of inline constants that a later SET_BYTES of the same slot overrides patches nothing", () => {
  using ctx = testContext();
  const { device } = ctx;
  using x = device.upload(new Float32Array(E).map((_, j) => j + 1)), y = device.upload(new Float32Array(E).fill(1));
  using out = device.alloc(E * 4, DType.F32);
  const w = new RawWords().pipeline(device, "axpby_f32");
  w.buffer(0, x, 0, E * 4).buffer(1, y, 0, E * 4).buffer(2, out, 0, E * 4);
  const dead = w.w.length + 2; // alpha of the first SET_BYTES: after its header and length words
  w.bytes(3, f32(100), f32(0), E, 0).bytes(3, f32(2), f32(0), E, 0).threads([E, 1, 1], [E, 1, 1]);
  const bytes = w.take(), words = new Uint32Array(bytes.buffer);
  equal(words[dead], f32(100));
  const template = new CommandTemplate(device, {
    bytes,
    words,
    groupSizes: new Int32Array([1]),
    dispatches: 1,
    lastPipeline: device.kernels.get("axpby_f32").handle,
  });
  try {
    words[dead] = f32(7); // the overridden alpha: decoding still computes 2 x
    const expected = run(device, bytes, out);
    deepStrictEqual(expected, Array.from({ length: E }, (_, j) => 2 * (j + 1)));
    out.write(new Float32Array(E));
    if (template.wordChanged(dead)) deepStrictEqual(run(device, bytes, out, template), expected);
  } finally {
    template.dispose();
  }
});

Deno.test("a template patches at most one distinct constant word per four dispatches; a word changed again counts once", () => {
  using ctx = testContext();
  const { device } = ctx;
  using x = device.upload(new Float32Array(E).fill(1)), y = device.upload(new Float32Array(E).fill(1));
  using out = device.alloc(E * 4, DType.F32);
  const w = new RawWords().pipeline(device, "axpby_f32");
  const sites: number[] = [];
  for (let i = 0; i < 600; i++) {
    w.buffer(0, x, 0, E * 4).buffer(1, y, 0, E * 4).buffer(2, out, 0, E * 4);
    sites.push(w.w.length + 2, w.w.length + 3); // alpha and beta
    w.bytes(3, f32(1), f32(1), E, 0).threads([E, 1, 1], [E, 1, 1]);
    w.rec(Op.BARRIER, 0);
  }
  const bytes = w.take(), words = new Uint32Array(bytes.buffer);
  const template = new CommandTemplate(device, {
    bytes,
    words,
    groupSizes: new Int32Array(600).fill(1),
    dispatches: 600,
    lastPipeline: device.kernels.get("axpby_f32").handle,
  });
  try {
    const bound = 600 / 4;
    for (let i = 0; i < bound; i++) equal(template.wordChanged(sites[i]!), true, `word ${i}`);
    equal(template.wordChanged(sites[0]!), true, "already patched");
    equal(template.wordChanged(sites[bound]!), false, "one past the bound");
    equal(template.patchList()[1], bound * 4);
  } finally {
    template.dispose();
  }
});

Deno.test("stream repeats: a stream like the template's replays with its constants; any other change decodes", () => {
  using ctx = testContext();
  const { device } = ctx;
  const sym = device.sym;
  using x = device.upload(new Float32Array(E).map((_, j) => j + 1)), y = device.upload(new Float32Array(E).fill(1));
  using out = device.alloc(E * 4, DType.F32);
  const stream = (alpha: number, tag: number) => {
    const w = new RawWords().pipeline(device, "axpby_f32");
    w.buffer(0, x, 0, E * 4).buffer(1, y, 0, E * 4).buffer(2, out, 0, E * 4).bytes(3, f32(alpha), f32(0), E, 0);
    return w.rec(Op.DISPATCH_THREADS, 0, E, 1, 1, E, 1, 1, tag).take();
  };
  // A writer's buffer is longer than its stream: what lies past byteLength must not matter.
  const inScratch = (s: Uint8Array, junk: number) => {
    const b = new Uint8Array(s.byteLength + 64).fill(junk);
    b.set(s);
    return b;
  };
  const repeats = new StreamRepeats(device);
  // Runs the pass through the repeats (or decodes it when they decline): out = alpha · x.
  const run = (bytes: Uint8Array, n: number) => {
    const cb = rawCommandBuffer(device);
    const rc = repeats.encodeInto(cb.ptr, bytes, n);
    if (rc === null) equal(cb.encode(bytes.subarray(0, n)).rc, Status.OK);
    else equal(rc, Status.OK, lastErrorText(sym));
    cb.run();
    return rc;
  };
  const expect = (alpha: number) => Array.from({ length: E }, (_, j) => alpha * (j + 1));
  try {
    const a = stream(2, 0), n = a.byteLength;
    equal(run(inScratch(a, 1), n), null, "first sight decodes");
    equal(run(inScratch(a, 2), n), Status.OK, "second sight: a template of it, replayed");
    equal(run(inScratch(a, 3), n), Status.OK, "a repeat replays");
    deepStrictEqual(Array.from(out.read() as Float32Array), expect(2));
    // The same length with another alpha: a constant, patched into the replay.
    equal(run(stream(3, 0), n), Status.OK, "changed constants replay");
    deepStrictEqual(Array.from(out.read() as Float32Array), expect(3));
    // The dispatch's tag is no patchable word: decoded; twice in a row makes the template anew.
    equal(run(stream(5, 1), n), null, "a changed dispatch record decodes");
    deepStrictEqual(Array.from(out.read() as Float32Array), expect(5));
    equal(run(stream(6, 1), n), Status.OK, "the second such pass remakes the template from itself");
    deepStrictEqual(Array.from(out.read() as Float32Array), expect(6));
    equal(run(stream(7, 1), n), Status.OK, "and the next ones replay it");
    deepStrictEqual(Array.from(out.read() as Float32Array), expect(7));
  } finally {
    repeats.clear();
  }
});

Deno.test("a patched dispatch is validated on its final constants, its entries spread over the list", () => {
  using ctx = testContext();
  const { device } = ctx;
  const sym = device.sym;
  using x = device.upload(new Float32Array(E).map((_, j) => j + 1)), y = device.upload(new Float32Array(E).fill(1));
  using out = device.alloc(2 * E * 4, DType.F32);
  const w = new RawWords().pipeline(device, "axpby_f32");
  for (let i = 0; i < 2; i++) {
    w.buffer(0, x, 0, E * 4).buffer(1, y, 0, E * 4).buffer(2, out, i * E * 4, E * 4);
    w.bytes(3, f32(1), f32(0), E, 0).threads([E, 1, 1], [E, 1, 1]);
  }
  const template = rawCommandBuffer(device);
  equal(template.encode(w.take()).rc, Status.OK);
  const replay = (...entries: number[][]) => {
    const cb = rawCommandBuffer(device), patch = new Uint32Array(entries.flat());
    const rc = sym.mlxn_cmdbuf_replay_patched(cb.ptr, template.ptr, patch, patch.length);
    return { cb, rc, message: rc === Status.OK ? "" : lastErrorText(sym) };
  };
  try {
    // Dispatch 0's n goes past its slices, then back (after a patch of dispatch 1): the final n is valid.
    const good = replay([0, 3, 8, E + 1], [1, 3, 0, f32(3)], [0, 3, 8, E], [0, 3, 0, f32(2)]);
    equal(good.rc, Status.OK, good.message);
    good.cb.run();
    const got = Array.from(out.read() as Float32Array);
    deepStrictEqual(got, [
      ...Array.from({ length: E }, (_, j) => 2 * (j + 1)),
      ...Array.from({ length: E }, (_, j) => 3 * (j + 1)),
    ]);
    // The reverse: valid first, invalid last, for either dispatch; the command buffer fails for good.
    for (const k of [0, 1]) {
      const bad = replay([k, 3, 8, E], [1 - k, 3, 0, f32(5)], [k, 3, 8, E + 1]);
      equal(bad.rc, Status.E_STREAM);
      match(bad.message, new RegExp(`patched dispatch ${k}: kernel axpby_f32`));
      equal(bad.cb.encode(new Uint8Array(0)).rc, Status.E_STREAM, "failed for good");
      bad.cb.free();
    }
  } finally {
    template.free();
  }
});
