/**
 * Automatic barriers placed by the native stream decoder (AUTO_BARRIERS and TRACK records) for
 * direct encoders: the barrier positions, counts and group sizes of random passes against a
 * brute-force scan of the placement rule written here, and against the JS BarrierPolicy (which a
 * validating encoder still uses); exact placement over hundreds of disjoint slices; the results of
 * a dependent chain; and hostile TRACK / AUTO_BARRIERS records straight into the native decoder.
 */
import { deepStrictEqual, equal, match, ok } from "node:assert/strict";
import fc from "fast-check";
import { counters, DType, GraphExecutor, type MemRange, type MlxBuffer, type MlxDevice } from "../mod.ts";
import type { CommandEncoder } from "../src/encoder.ts";
import { ABI_VERSION, Limits, Op, recordHeader, RecordWords, Stat, Status, Track } from "../src/native/abi.ts";
import { lastErrorText } from "../src/native/status.ts";
import { rangesOverlap, sameRange } from "../src/graph/ranges.ts";
import { openDevice } from "./helpers.ts";

/** One access of a dispatch or a user range: bytes [s, e) of allocation `a`. */
interface Access {
  a: number;
  s: number;
  e: number;
  write: boolean;
}

/**
 * The placement rule by brute force: every access of the current group in a list, scanned in full
 * (read–read never conflicts; a read against a recorded write, a write against anything recorded;
 * empty ranges and different allocations never), with the encoder's counting conventions.
 */
class Reference {
  auto: boolean;
  group: Access[] = [];
  dispatches = 0;
  barriers = 0;
  autoBarriers = 0;
  autoConcurrent = 0;
  pending = false; // a barrier since the last dispatch
  open = 0;
  closed: number[] = [];

  constructor(auto: boolean) {
    this.auto = auto;
  }

  conflicts(list: readonly Access[]): boolean {
    return list.some((x) =>
      x.s < x.e &&
      this.group.some((g) => g.a === x.a && g.s < x.e && x.s < g.e && g.s < g.e && (x.write || g.write))
    );
  }

  #barrier(): void {
    this.group = [];
    if (this.dispatches > 0) {
      this.barriers++;
      this.pending = true;
    }
  }

  /** A checked addition (a dispatch with auto barriers on, or barrierBetween); true if a barrier came first. */
  #checkAndAdd(list: readonly Access[]): boolean {
    const barrier = this.conflicts(list) && this.dispatches > 0;
    if (barrier) {
      this.#barrier();
      this.autoBarriers++;
    } else this.autoConcurrent++;
    this.group.push(...list);
    return barrier;
  }

  dispatch(list: readonly Access[]): void {
    if (this.auto) this.#checkAndAdd(list);
    if (this.dispatches === 0 || this.pending) {
      if (this.open > 0) this.closed.push(this.open);
      this.open = 0;
    }
    this.pending = false;
    this.open++;
    this.dispatches++;
  }

  handBarrier(): void {
    this.#barrier();
  }

  between(list: readonly Access[]): void {
    this.#checkAndAdd(list);
  }

  track(list: readonly Access[]): void {
    this.group.push(...list);
  }

  setAuto(on: boolean): void {
    this.auto = on; // the group stays: only barriers forget it
  }

  histogram(): number[] {
    const h: number[] = [];
    for (const size of [...this.closed, ...(this.open > 0 ? [this.open] : [])]) {
      while (h.length <= size) h.push(0);
      h[size]!++;
    }
    return h;
  }

  get groups(): number {
    return this.closed.length + (this.open > 0 ? 1 : 0);
  }
}

type ViewSpec = { alloc: number; off: number; len: number };
type RangeSpec = { view: number; tuple: boolean; empty: boolean; raw?: [number, number, number] };
type Cmd =
  | { k: "add"; a: number; b: number; out: number }
  | { k: "step"; state: number }
  | { k: "barrier" }
  | { k: "between" | "track"; reads: RangeSpec[]; writes: RangeSpec[] }
  | { k: "auto"; on: boolean }
  | { k: "switch" }
  | { k: "peek" };

const ALLOC_BYTES = [64, 128, 256];

function viewSpec(allocs: number): fc.Arbitrary<ViewSpec> {
  return fc.record({ alloc: fc.nat(allocs - 1), off: fc.nat(60), len: fc.integer({ min: 1, max: 16 }) })
    .map(({ alloc, off, len }) => ({ alloc, off: off * 4, len: len * 4 }));
}

function program(): fc.Arbitrary<{ sizes: number[]; views: ViewSpec[]; cmds: Cmd[]; auto: boolean[] }> {
  return fc.integer({ min: 1, max: 6 }).chain((nAllocs) =>
    fc.record({
      sizes: fc.array(fc.constantFrom(...ALLOC_BYTES), { minLength: nAllocs, maxLength: nAllocs }),
      views: fc.array(viewSpec(nAllocs), { minLength: 3, maxLength: 12 }),
      auto: fc.tuple(fc.boolean(), fc.boolean()).map(([a, b]) => [a, b]),
    }).chain(({ sizes, views, auto }) => {
      const v = fc.nat(views.length - 1);
      // A view (or its tuple, or an empty one), or any bytes of an allocation as a tuple.
      const range = fc.oneof(
        fc.record({ view: v, tuple: fc.boolean(), empty: fc.boolean() }),
        fc.record({
          view: fc.constant(0),
          tuple: fc.constant(true),
          empty: fc.constant(false),
          raw: fc.tuple(fc.nat(nAllocs - 1), fc.nat(255), fc.nat(24)),
        }),
      );
      const ranges = fc.array(range, { maxLength: 4 });
      const cmd: fc.Arbitrary<Cmd> = fc.oneof(
        { weight: 10, arbitrary: fc.record({ k: fc.constant("add" as const), a: v, b: v, out: v }) },
        { weight: 2, arbitrary: fc.record({ k: fc.constant("step" as const), state: v }) },
        { weight: 2, arbitrary: fc.constant({ k: "barrier" as const }) },
        {
          weight: 2,
          arbitrary: fc.record({
            k: fc.constantFrom("between" as const, "track" as const),
            reads: ranges,
            writes: ranges,
          }),
        },
        { weight: 1, arbitrary: fc.record({ k: fc.constant("auto" as const), on: fc.boolean() }) },
        { weight: 2, arbitrary: fc.constant({ k: "switch" as const }) },
        { weight: 3, arbitrary: fc.constant({ k: "peek" as const }) },
      );
      return fc.record({
        sizes: fc.constant(sizes),
        views: fc.constant(views.map((x) => ({ ...x, off: Math.min(x.off, sizes[x.alloc]! - x.len) }))),
        auto: fc.constant(auto),
        cmds: fc.array(cmd, { minLength: 1, maxLength: 80, size: "max" }), // whole programs, not the default ~10 commands
      });
    })
  );
}

/** Runs a program on two encoders (`make` opens them) and checks every observable against two references. */
function runProgram(
  device: MlxDevice,
  p: { sizes: number[]; views: ViewSpec[]; cmds: Cmd[]; auto: boolean[] },
  make: (auto: boolean) => CommandEncoder,
): void {
  const add = device.kernels.get("elementwise_add_f32"), step = device.kernels.get("step_advance_u32");
  const allocs = p.sizes.map((n) => device.alloc(n, DType.F32));
  try {
    const views: MlxBuffer[] = p.views.map((v) => allocs[v.alloc]!.slice(v.off, v.len));
    const acc = (view: number, write: boolean): Access => {
      const r = views[view]!.range();
      return { a: r[0], s: r[1], e: r[2], write };
    };
    const rangeOf = (r: RangeSpec): MlxBuffer | MemRange => {
      if (r.raw) return [allocs[r.raw[0]]!.allocId, r.raw[1], r.raw[1] + r.raw[2]];
      const view = views[r.view]!;
      if (r.empty) return r.tuple ? [view.allocId, view.byteOffset, view.byteOffset] : view.slice(0, 0);
      return r.tuple ? view.range() : view;
    };
    const accOf = (r: RangeSpec, write: boolean): Access => {
      if (r.raw) { // the native side cuts a range at its allocation's end (bytes past it are never bound)
        const size = p.sizes[r.raw[0]]!, e = Math.min(r.raw[1] + r.raw[2], size);
        return { a: allocs[r.raw[0]]!.allocId, s: Math.min(r.raw[1], e), e, write };
      }
      const x = acc(r.view, write);
      return r.empty ? { ...x, e: x.s } : x;
    };
    counters.reset();
    const encs = p.auto.map(make), refs = p.auto.map((a) => new Reference(a));
    let cur = 0;
    try {
      p.cmds.forEach((c, i) => {
        const enc = encs[cur]!, ref = refs[cur]!;
        switch (c.k) {
          case "add": {
            // The decoder refuses an output that partly overlaps an input: such a command is left out.
            const o = views[c.out]!.range();
            if ([c.a, c.b].some((k) => rangesOverlap(views[k]!.range(), o) && !sameRange(views[k]!.range(), o))) break;
            const n = Math.min(views[c.a]!.length, views[c.b]!.length, views[c.out]!.length);
            enc.dispatch({
              pipeline: add,
              bindings: [views[c.a]!, views[c.b]!, views[c.out]!, [n]],
              grid: n,
              threadgroup: n,
              dispatchKind: "threads",
            });
            ref.dispatch([acc(c.a, false), acc(c.b, false), acc(c.out, true)]);
            break;
          }
          case "step":
            enc.dispatch({
              pipeline: step,
              bindings: [views[c.state]!, [1, 1]],
              grid: 1,
              threadgroup: 1,
              dispatchKind: "threads",
            });
            ref.dispatch([acc(c.state, true)]);
            break;
          case "barrier":
            enc.memoryBarrier();
            ref.handBarrier();
            break;
          case "between":
          case "track": {
            const list = [...c.reads.map((r) => accOf(r, false)), ...c.writes.map((r) => accOf(r, true))];
            if (c.k === "between") {
              enc.barrierBetween(c.reads.map(rangeOf), c.writes.map(rangeOf));
              ref.between(list);
            } else {
              enc.trackDispatch(c.reads.map(rangeOf), c.writes.map(rangeOf));
              ref.track(list);
            }
            break;
          }
          case "auto":
            enc.autoBarriers = c.on;
            ref.setAuto(c.on);
            break;
          case "switch":
            cur = 1 - cur;
            break;
          case "peek": // flushes: the count after every command of a run pins each barrier's position
            equal(enc.barrierCount, ref.barriers, `command ${i}: barriers`);
            break;
        }
      });
      for (let e = 0; e < 2; e++) {
        const enc = encs[e]!, ref = refs[e]!;
        equal(enc.barrierCount, ref.barriers, `encoder ${e}: barriers`);
        const st = enc.groupStats();
        equal(st.dispatches, ref.dispatches, `encoder ${e}: dispatches`);
        equal(st.groups, ref.groups, `encoder ${e}: groups`);
        deepStrictEqual(st.histogram, ref.histogram(), `encoder ${e}: group sizes`);
      }
      const c = counters.snapshot();
      equal(c.barriers, refs[0]!.barriers + refs[1]!.barriers, "counters: barriers");
      equal(c.autoBarriers, refs[0]!.autoBarriers + refs[1]!.autoBarriers, "counters: autoBarriers");
      equal(c.autoConcurrent, refs[0]!.autoConcurrent + refs[1]!.autoConcurrent, "counters: autoConcurrent");
      equal(c.dispatches, refs[0]!.dispatches + refs[1]!.dispatches, "counters: dispatches");
    } finally {
      for (const e of encs) e.dispose();
    }
  } finally {
    for (const a of allocs) a.dispose();
  }
}

Deno.test("random direct passes: the native decoder's barriers are the brute-force placement, and the JS policy's", () => {
  using device = openDevice({ backend: "cpu" });
  fc.assert(
    fc.property(program(), (p) => {
      // The native decoder (direct encoders), then the JS BarrierPolicy (a validating encoder keeps it).
      runProgram(device, p, (auto) => device.commandEncoder({ autoBarriers: auto, validate: false }));
      runProgram(device, p, (auto) => device.commandEncoder({ autoBarriers: auto, validate: true }));
    }),
    { numRuns: 300, seed: 16 },
  );
});

Deno.test("disjoint slices of one buffer need no barrier in any order; a hazard on every dispatch gets one each", () => {
  using device = openDevice({ backend: "cpu" });
  const exec = new GraphExecutor(device);
  const N = 800, E = 16;
  using x = device.upload(new Float32Array(E).fill(1)), y = device.upload(new Float32Array(E).fill(2));
  using wide = device.alloc(N * E * 4, DType.F32), sink = device.alloc(E * 4, DType.F32);
  const slices = Array.from({ length: N }, (_, i) => wide.slice(i * E * 4, E * 4));
  // Slices with gaps between them too (every other 64-byte block), which never merge into one interval.
  using gapped = device.alloc(2 * N * E * 4, DType.F32);
  const spaced = Array.from({ length: N }, (_, i) => gapped.slice(2 * i * E * 4, E * 4));
  let seed = 5;
  const shuffle = <T>(a: T[]) =>
    a.map((v) => [v, seed = (seed * 48271) % 2147483647] as const).sort((p, q) => p[1] - q[1]).map((p) => p[0]);
  const orders: [string, MlxBuffer[]][] = [
    ["forward", slices],
    ["reversed", slices.slice().reverse()],
    ["shuffled", shuffle(slices)],
    ["gapped, shuffled", shuffle(spaced)],
  ];
  for (const [name, order] of orders) {
    counters.reset();
    using s = exec.begin({ autoBarriers: true });
    for (const out of order) s.elementwiseAdd(x, y, out);
    const st = s.encoder.groupStats();
    equal(s.encoder.barrierCount, 0, name);
    equal(st.groups, 1, name);
    equal(st.histogram[N], 1, name);
    equal(counters.snapshot().autoConcurrent, N, name);
    // One more dispatch reading any slice conflicts (RAW): exactly one barrier.
    s.elementwiseAdd(order[N >> 1]!, y, sink);
    equal(s.encoder.barrierCount, 1, `${name}: the read of a written slice`);
    s.finish();
    ok((wide.read() as Float32Array).every((v) => v === 3) || name.startsWith("gapped"), name);
  }
  using out = device.alloc(E * 4, DType.F32);
  using s = exec.begin({ autoBarriers: true });
  for (let i = 0; i < N; i++) s.elementwiseAdd(out, y, out); // out += 2, each reading the last
  equal(s.encoder.barrierCount, N - 1);
  deepStrictEqual(s.encoder.groupStats().histogram, [0, N]);
  s.finish();
  ok((out.read() as Float32Array).every((v) => v === 2 * N), "the chain ran in order");
});

Deno.test("user ranges: tuples of disposed or foreign allocations are left out, ranges past the end are cut", () => {
  using device = openDevice({ backend: "cpu" });
  using other = openDevice({ backend: "cpu" });
  using a = device.alloc(64, DType.F32), b = device.alloc(64, DType.F32), x = device.alloc(64, DType.F32);
  using foreign = other.alloc(64, DType.F32);
  const add = { pipeline: device.kernels.get("elementwise_add_f32"), grid: 16, threadgroup: 16 } as const;
  using enc = device.commandEncoder({ autoBarriers: true, validate: false });
  enc.dispatch({ ...add, bindings: [x, x, a, [16]], dispatchKind: "threads" }); // writes a
  const dead = device.alloc(64, DType.F32), deadId = dead.allocId;
  dead.dispose();
  enc.barrierBetween([[deadId, 0, 64], [foreign.allocId, 0, 64], foreign], []); // nothing live to check
  equal(enc.barrierCount, 0);
  enc.barrierBetween([[a.allocId, 60, 1 << 20]], []); // cut at 64 bytes: still reads a's last word
  equal(enc.barrierCount, 1);
  enc.trackDispatch([], [[b.allocId, 64, 4096]]); // entirely past the end: touches nothing
  enc.barrierBetween([b], []);
  equal(enc.barrierCount, 1);
});

Deno.test("TRACK and AUTO_BARRIERS constants match the header", () => {
  const header = Deno.readTextFileSync(new URL("../native/mlxn.h", import.meta.url));
  const defines = (prefix: string) =>
    Object.fromEntries(
      [...header.matchAll(/^#define MLXN_(\w+) (-?\d+)/gm)].filter((m) => m[1]!.startsWith(prefix))
        .map((m) => [m[1]!.slice(prefix.length), Number(m[2])]),
    );
  deepStrictEqual(defines("TRACK_"), { ...Track });
  deepStrictEqual(defines("STAT_"), { ...Stat });
  ok(ABI_VERSION >= 3);
});

/** Encodes raw stream words into a fresh command buffer; returns the status and the error text. */
function encodeRaw(device: MlxDevice, words: number[]): { rc: number; error: string; stats: number[] } {
  const sym = device.sym;
  // deno-lint-ignore no-explicit-any
  const cb = sym.mlxn_cmdbuf_new((device as any).devicePtr())!;
  try {
    const bytes = new Uint8Array(Uint32Array.from(words).buffer);
    const rc = sym.mlxn_cmdbuf_encode(cb, bytes, bytes.byteLength);
    const error = rc === Status.OK ? "" : lastErrorText(sym);
    const out = new Uint32Array(Stat.COUNT + Stat.SMALL_SIZES);
    equal(sym.mlxn_cmdbuf_barrier_stats(cb, out, out.length), out.length);
    return { rc, error, stats: [...out.subarray(0, Stat.COUNT)] };
  } finally {
    sym.mlxn_cmdbuf_free(cb);
  }
}

Deno.test("hostile TRACK and AUTO_BARRIERS records are refused with a reason, never run", () => {
  using device = openDevice({ backend: "cpu" });
  using buf = device.alloc(256, DType.F32);
  const h = buf.handle;
  const track = (...entries: number[][]) => [
    recordHeader(Op.TRACK, RecordWords.TRACK_HEADER + RecordWords.TRACK_ENTRY * entries.length),
    ...entries.flat(),
  ];
  const ok1 = encodeRaw(device, [
    ...track([h, Track.WRITE, 0, 0, 64, 0]),
    ...track([h, Track.READ | Track.CHECK, 0, 0, 4, 0]),
  ]);
  equal(ok1.rc, Status.OK, ok1.error);
  equal(ok1.stats[Stat.AUTO_BARRIERS], 0, "no dispatch yet: no barrier");
  equal(ok1.stats[Stat.AUTO_CONCURRENT], 1);
  const bad: [string, number[], RegExp][] = [
    ["a stale handle", track([h + (1 << 20), Track.READ, 0, 0, 4, 0]), /not a live buffer/],
    ["a never allocated handle", track([0xfffff, Track.READ, 0, 0, 4, 0]), /not a live buffer/],
    ["a range past the end", track([h, Track.READ, 200, 0, 64, 0]), /past the end of a 256-byte buffer/],
    ["an offset overflowing 64 bits", track([h, Track.WRITE, 0xfffffff8, 0xffffffff, 16, 0]), /past the end/],
    ["a length overflowing 64 bits", track([h, Track.WRITE, 8, 0, 0xfffffff8, 0xffffffff]), /past the end/],
    ["no access", track([h, 0, 0, 0, 4, 0]), /neither read nor written/],
    ["unknown flags", track([h, Track.READ | 64, 0, 0, 4, 0]), /unknown flags/],
    [
      "CHECK in some ranges only",
      track([h, Track.READ | Track.CHECK, 0, 0, 4, 0], [h, Track.READ, 0, 0, 4, 0]),
      /CHECK/,
    ],
    ["no range", [recordHeader(Op.TRACK, 1)], /at least one/],
    ["a partial range", [recordHeader(Op.TRACK, 4), h, Track.READ, 0], /words per range/],
    ["a slot", [recordHeader(Op.TRACK, 7, 3), h, Track.READ, 0, 0, 4, 0], /has no slot/],
    ["truncated", [recordHeader(Op.TRACK, 13), h, Track.READ, 0, 0, 4, 0], /truncated record/],
    [
      "too many ranges",
      track(...Array.from({ length: Limits.MAX_TRACK_ENTRIES + 1 }, () => [h, Track.READ, 0, 0, 4, 0])),
      /at most 1024/,
    ],
    ["AUTO_BARRIERS 2", [recordHeader(Op.AUTO_BARRIERS, 1, 2)], /0 \(off\) or 1 \(on\)/],
    ["AUTO_BARRIERS with a word", [recordHeader(Op.AUTO_BARRIERS, 2, 1), 0], /must be 1 words/],
  ];
  for (const [name, words, why] of bad) {
    const r = encodeRaw(device, words);
    ok(r.rc !== Status.OK, `${name}: accepted`);
    match(r.error, why, name);
  }
  const sym = device.sym;
  equal(sym.mlxn_cmdbuf_barrier_stats(null, new Uint32Array(8), 8), 0);
});

Deno.test("the barrier count of a stream the decoder rejects does not throw; the next encode reports the rejection", () => {
  using device = openDevice({ backend: "cpu" });
  using a = device.alloc(64, DType.F32), x = device.alloc(64, DType.F32);
  const add = { pipeline: device.kernels.get("elementwise_add_f32"), dispatchKind: "threads" } as const;
  using enc = device.commandEncoder({ autoBarriers: true, validate: false });
  enc.dispatch({ ...add, bindings: [x, x, a, [16]], grid: 16, threadgroup: 16 });
  // The output partly overlaps an input: the TS encoder writes it, the native decoder refuses it.
  enc.dispatch({ ...add, bindings: [a.slice(0, 32), x, a.slice(16, 32), [8]], grid: 8, threadgroup: 8 });
  equal(enc.barrierCount, 0);
  equal(enc.groupStats().dispatches, 2);
  equal(enc.state, "failed");
  let thrown: unknown;
  try {
    enc.dispatch({ ...add, bindings: [x, x, a, [16]], grid: 16, threadgroup: 16 });
  } catch (e) {
    thrown = e;
  }
  match(String(thrown), /stream was rejected .*partly overlaps/);
});

Deno.test("a direct dispatch after a cached plan's appended records gets a barrier first (the plan is not tracked)", async () => {
  const { CommandEncoder: Encoder } = await import("../src/encoder.ts");
  using device = openDevice({ backend: "cpu" });
  const exec = new GraphExecutor(device);
  using a = device.upload(new Float32Array(64).fill(1)), b = device.upload(new Float32Array(64).fill(2));
  using out = device.alloc(256, DType.F32), out2 = device.alloc(256, DType.F32);
  const pass = () => {
    const s = exec.beginRecorded();
    s.elementwiseAdd(a, b, out);
    return s.finish({ fuse: true, reorder: true });
  };
  pass(); // a miss records the plan; the next identical pass replays its records
  const append = Encoder.prototype.appendPlanRecords;
  let records: Parameters<typeof append> | undefined;
  Encoder.prototype.appendPlanRecords = function (...args) {
    records = args;
    return append.apply(this, args);
  };
  try {
    equal(pass().planCache, "hit");
  } finally {
    Encoder.prototype.appendPlanRecords = append;
  }
  ok(records !== undefined, "the hit appended its records");
  const enc = device.commandEncoder({ autoBarriers: true });
  ok(enc.appendPlanRecords(...records!), "a fresh direct encoder takes the records");
  // Reads what the plan's dispatch writes: without a barrier the two would run as one group.
  const reg = device.kernels;
  enc.dispatch({
    pipeline: reg.get("elementwise_add_f32"),
    bindings: [out, b, out2, [64]],
    grid: 64,
    threadgroup: 64,
    dispatchKind: "threads",
  });
  equal(enc.barrierCount, 1, "one barrier between the plan and the dispatch that reads its output");
  equal(enc.groupStats().groups, 2);
  enc.commitAndWait();
  deepStrictEqual(Array.from(out2.read() as Float32Array).slice(0, 64), new Array(64).fill(5));
  enc.dispose();
});
