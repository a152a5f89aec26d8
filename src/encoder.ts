/**
 * CommandEncoder: ONE command buffer with ONE persistent concurrent compute encoder. Dispatches are
 * written into a binary command stream and handed to the native library in one FFI call per flush;
 * `memoryBarrier()` separates concurrent groups. Its jobs live in their own modules: the stream
 * writer (native/stream.ts, dispatch_writer.ts), the barrier policy (barrier_policy.ts), the capture
 * recorder (capture_recorder.ts) and the native command buffer's lifecycle (command_buffer.ts).
 *
 * @module
 */

import { liveAllocation, MlxBuffer } from "./buffer.ts";
import { counterState } from "./counters.ts";
import { MlxError } from "./errors.ts";
import { BarrierPolicy, type GroupStats } from "./barrier_policy.ts";
import { type Capture, CaptureRecorder, dispatchNode } from "./capture_recorder.ts";
import { barrierStatsWords, CommandBufferSlot, type EncoderHost, type EncoderState } from "./command_buffer.ts";
import type { CommandTemplate, StreamRepeats } from "./command_template.ts";
import type { DispatchDescriptor } from "./dispatch.ts";
import { BARRIER, type CapturedNode, type Dims, type PipelineRef } from "./graph/nodes.ts";
import type { CapturedOpKind } from "./graph/op_kind.ts";
import { accessesOf, checkRanges, type MemRange } from "./graph/ranges.ts";
import {
  findBrokenConstantPromises,
  findHazards,
  formatBrokenPromises,
  formatHazards,
  type Hazard,
} from "./graph/validate.ts";
import { Pipeline, type SlotSpec } from "./kernels.ts";
import { CbStatus, Limits, RecordWords, Stat, Status, Track } from "./native/abi.ts";
import type { NativeSymbols } from "./native/ffi.ts";
import { codeOf, lastErrorText, readText } from "./native/status.ts";
import { writeDispatch } from "./dispatch_writer.ts";
import {
  H_AUTO_BARRIERS_OFF,
  H_AUTO_BARRIERS_ON,
  H_DISPATCH_GROUPS,
  H_DISPATCH_THREADS,
  H_SET_PIPELINE,
  StreamWriter,
  trackHeader,
  TWO_32,
} from "./native/stream.ts";

export type { Binding, Dims, DispatchKind, InlineWords } from "./graph/nodes.ts";
export type { DispatchDescriptor } from "./dispatch.ts";
export { CommandBufferSlot, type EncoderHost, type EncoderState } from "./command_buffer.ts";

/** Timing of one dispatch (backend clock, ns). */
export interface DispatchTiming {
  /** Dispatch index within the command buffer. */
  readonly index: number;
  /** Kernel name. */
  readonly kernel: string;
  /** Op kind of the dispatch. */
  readonly opKind: string;
  /** First threadgroup start. */
  readonly startNs: number;
  /** Last threadgroup end. */
  readonly endNs: number;
}

/** How to commit a command buffer. */
export interface CommitOptions {
  /** Label, for profiling and error messages. */
  label?: string | undefined;
  /** Block until the command buffer completed (throws CommandBufferError on failure). */
  wait?: boolean | undefined;
}

/** Options of a command encoder. */
export interface EncoderOptions {
  /** Track every dispatch and insert a barrier exactly where its accesses conflict. */
  autoBarriers?: boolean | undefined;
  /** Check every concurrent group for hazards at commit (MLXN_VALIDATE=1). */
  validate?: boolean | undefined;
}

export type { GroupStats } from "./barrier_policy.ts";

/** A buffer view or an explicit range, for barrierBetween / trackDispatch. */
export type RangeLike = MlxBuffer | MemRange;

function toRanges(list: readonly RangeLike[]): MemRange[] {
  return list.map((x) => x instanceof MlxBuffer ? x.range() : x);
}

/**
 * A well-formed range cut at its allocation's end (`byteLength`), as the native tracker takes user
 * ranges: `range` itself when it fits.
 */
function cutAtAllocationEnd(range: MemRange, byteLength: number): MemRange {
  return range[2] > byteLength ? [range[0], Math.min(range[1], byteLength), byteLength] : range;
}

// Dropped encoders release their command buffers here. Nothing is unregistered: a disposed
// encoder's slot has nothing left to release, and a registration costs a fraction of an
// unregistration (no token table). A closed device detaches its command buffers instead of freeing
// them, so they are always freed here or at dispose.
const cleanup = new FinalizationRegistry<CommandBufferSlot>((cb) => cb.collected());

const NO_OPTIONS: EncoderOptions = Object.freeze({});
const NO_HAZARDS: readonly Hazard[] = Object.freeze([]);

const timingScratch = new BigUint64Array(2);

function dim(d: Dims, i: number): number {
  if (typeof d === "number") return i === 0 ? d : 1;
  return i < d.length ? d[i]! : 1;
}

function validDim(v: number): boolean {
  return (v >>> 0) === v && v > 0;
}

/**
 * One command buffer and its concurrent compute encoder. Create with `device.commandEncoder()`;
 * dispatch, place barriers, then commit exactly once.
 *
 * @example
 * ```ts
 * import { KernelRegistry, MlxDevice } from "@mlxn/mlx-native";
 * using device = MlxDevice.open({ backend: "cpu" });
 * const add = new KernelRegistry(device).get("elementwise_add_f32");
 * using a = device.upload(new Float32Array([1, 2])), b = device.upload(new Float32Array([3, 4]));
 * using out = device.alloc(8);
 * using enc = device.commandEncoder();
 * enc.dispatch({
 *   pipeline: add,
 *   bindings: [a, b, out, new Uint8Array(new Uint32Array([2]).buffer)],
 *   grid: 2, threadgroup: 2, dispatchKind: "threads",
 * });
 * enc.commitAndWait();
 * ```
 */
export class CommandEncoder {
  readonly #host: EncoderHost;
  readonly #sym: NativeSymbols;
  readonly #cb: CommandBufferSlot; // native command buffer, writer and lifecycle state
  #pipeline = 0;
  #dispatches = 0;
  #barriers = 0;
  #label = "";
  #kernels: { kernel: string; opKind: string }[] | null; // per dispatch, when profiling dispatches
  #barriersBefore: number[] | null; // dispatch counts at barriers, when profiling
  #gpuStartNs = 0;
  #gpuEndNs = 0;
  #timings: DispatchTiming[] | null = null;
  #capture: CaptureRecorder | null = null; // capture mode
  readonly #policy: BarrierPolicy; // auto barriers and group statistics
  // The native decoder tracks this encoder's direct dispatches and user ranges (no validation log
  // and no profiler, which need every barrier here): dispatch() then only writes the dispatch.
  readonly #native: boolean;
  #direct: boolean; // #native and not capturing
  #opPath: boolean; // #direct without per-dispatch bookkeeping: ops write their records themselves
  #opPipeline = 0; // the pipeline of the op dispatch being written
  #nativeAuto = false; // the AUTO_BARRIERS state written to the stream
  // A cached plan's records were appended untracked: tracking starts behind a barrier (its accesses
  // are not in the decoder's group).
  #planTail = false;
  #nativeTracked = false; // the stream turned tracking on or held a TRACK: a reset must be written where the policy forgets
  // validation: what was encoded, to check at commit
  #log: CapturedNode[] | null;
  #hazards: readonly Hazard[] = NO_HAZARDS;
  #repeats: StreamRepeats | null = null; // see useStreamRepeats

  /**
   * @ignore Internal: Use `device.commandEncoder()`. Validation defaults to the host's setting
   * (an explicit `validate: undefined` turns it off).
   */
  constructor(host: EncoderHost, options: EncoderOptions = NO_OPTIONS) {
    this.#policy = new BarrierPolicy(options.autoBarriers ?? false);
    const validate = options.validate === undefined && !("validate" in options) ? host.validate : options.validate;
    this.#log = validate ? [] : null;
    this.#host = host;
    this.#sym = host.sym;
    const ptr = host.sym.mlxn_cmdbuf_new(host.devicePtr());
    if (ptr === null) {
      throw new MlxError("OutOfMemory", `could not create a command buffer: ${lastErrorText(host.sym)}`);
    }
    this.#cb = new CommandBufferSlot(host, ptr);
    this.#kernels = host.profileDispatches ? [] : null;
    this.#barriersBefore = host.profiler ? [] : null;
    this.#native = this.#direct = this.#log === null && this.#barriersBefore === null;
    this.#opPath = this.#direct && this.#kernels === null;
    cleanup.register(this, this.#cb);
  }

  /** Dispatches encoded so far. */
  get dispatchCount(): number {
    return this.#dispatches;
  }

  /** Barriers issued so far (placed by hand or automatically). */
  get barrierCount(): number {
    const cb = this.#cb;
    if (!cb.nativeStats) return this.#barriers;
    this.#flushQuietly(); // the native decoder counts what it has seen; after commit the count is final
    return cb.barriers;
  }

  /** The label given at commit. */
  get label(): string {
    return this.#label;
  }

  /** "encoding", "committed", "completed", "failed" or "disposed". */
  get state(): EncoderState {
    return this.#cb.state;
  }

  /**
   * Encodes one dispatch (or records it, in capture mode). Bindings must match the kernel's contract
   * slot by slot. With auto barriers on, a barrier is inserted first if the dispatch's accesses
   * conflict with its concurrent group.
   */
  dispatch(d: DispatchDescriptor): void {
    if (this.#cb.state !== "encoding") throw this.#notEncoding("dispatch");
    const policy = this.#policy;
    if (this.#direct) {
      // Barriers, automatic or not, are the native decoder's business: only the dispatch is written.
      if (policy.auto !== this.#nativeAuto) this.#writeAutoBarriers(policy.auto);
      if (this.#writeDispatch(d)) return;
      this.#check(d); // says what is wrong
      throw new MlxError("InvalidArgument", `${d.pipeline.name}: the dispatch could not be encoded`);
    }
    if (policy.auto && this.#capture === null && this.#log === null) {
      // The barrier (if the accesses conflict) and the dispatch are written in one all-or-nothing
      // step, so a bad descriptor leaves no barrier behind and needs no separate check.
      const barrier = policy.stageDispatch(d.pipeline.contract, d.bindings) && this.#dispatches > 0;
      if (writeDispatch(this.#cb.writer!, d, this.#pipeline, this.#dispatches, barrier)) {
        if (barrier) {
          this.#barrierIssued();
          counterState.autoBarriers++;
        } else counterState.autoConcurrent++;
        policy.trackStaged();
        this.#dispatched(d);
        return;
      }
      this.#check(d); // says what is wrong
      throw new MlxError("InvalidArgument", `${d.pipeline.name}: the dispatch could not be encoded`);
    }
    const capture = this.#capture;
    if (capture !== null) {
      // Recorded as stream words, checked as they are written: a bad descriptor records nothing.
      // Automatic barriers are not placed here: the capture places them when its nodes are built
      // (on a plan-cache miss), so a pass that hits the cache never tracks an access.
      if (!capture.dispatch(d)) {
        this.#check(d); // says what is wrong
        throw new MlxError("InvalidArgument", `${d.pipeline.name}: the dispatch could not be recorded`);
      }
      return;
    }
    if (policy.auto || this.#log !== null) {
      this.#check(d); // before any barrier: a bad descriptor changes nothing
      if (policy.auto) {
        const acc = accessesOf(d.pipeline.contract, d.bindings);
        this.#track(acc.reads, acc.writes, true);
      }
    }
    if (this.#writeDispatch(d)) {
      this.#log?.push(dispatchNode(d, undefined, undefined, undefined));
      return;
    }
    this.#check(d); // says what is wrong
    throw new MlxError("InvalidArgument", `${d.pipeline.name}: the dispatch could not be encoded`);
  }

  /** Writes a dispatch's records (see writeDispatch); false with nothing written when it is not valid. */
  #writeDispatch(d: DispatchDescriptor): boolean {
    if (!writeDispatch(this.#cb.writer!, d, this.#pipeline, this.#dispatches)) return false;
    this.#dispatched(d);
    return true;
  }

  /**
   * @ignore Internal: the first step of the ops' write path (src/ops/common.ts). Where this encoder
   * writes dispatches straight into its stream (direct, encoding, no per-dispatch bookkeeping), makes
   * room for one dispatch of `p` and returns the word of {@link CommandEncoder.opWords} its binding
   * records start at (a SET_PIPELINE is stored there first when the pipeline changes). Nothing is
   * published until {@link CommandEncoder.opDispatch}. While recording (startCompactCapture), the
   * same holds for the recording's own words, where its recorder can take the dispatch without its
   * descriptor (CaptureRecorder.opBegin). -1 where the encoder needs a descriptor.
   */
  opBegin(p: Pipeline): number {
    // Kept small so that V8 inlines it into every op: a recording, an AUTO_BARRIERS record to write
    // first and a full writer go out of line.
    const w = this.#cb.writer;
    if (
      !this.#opPath || w === null || this.#policy.auto !== this.#nativeAuto ||
      w.pos + p.maxDispatchWords > w.words.length
    ) return this.#opBeginRare(p);
    let at = w.pos;
    const h = p.handle;
    if (h !== this.#pipeline) {
      const words = w.words;
      words[at] = H_SET_PIPELINE;
      words[at + 1] = h;
      at += 2;
    }
    this.#opPipeline = h;
    return at;
  }

  /** {@link CommandEncoder.opBegin}'s out-of-line cases. */
  #opBeginRare(p: Pipeline): number {
    if (!this.#opPath) {
      // A recording takes the same path into its own words (see CaptureRecorder.opBegin).
      const c = this.#capture;
      return c === null || this.#cb.state !== "encoding" ? -1 : c.opBegin(p);
    }
    const w = this.#cb.writer;
    if (w === null) return -1;
    if (this.#policy.auto !== this.#nativeAuto) this.#writeAutoBarriers(this.#policy.auto);
    const words = w.words;
    if (w.pos + p.maxDispatchWords > words.length) w.flush(); // StreamWriter.reserve
    let at = w.pos;
    const h = p.handle;
    if (h !== this.#pipeline) {
      words[at] = H_SET_PIPELINE;
      words[at + 1] = h;
      at += 2;
    }
    this.#opPipeline = h;
    return at;
  }

  /** @ignore Internal: the stream words of the ops' write path (valid after an opBegin that did not return -1). */
  get opWords(): Uint32Array {
    const c = this.#capture;
    return c === null ? this.#cb.writer!.words : c.opWords;
  }

  /**
   * @ignore Internal: ends a dispatch of the ops' write path whose binding records end at word `at`:
   * writes its DISPATCH record (`threads`: the grid counts threads) and publishes every record since
   * {@link CommandEncoder.opBegin}. Dimensions are positive u32 with at most the threadgroup limit.
   */
  opDispatch(
    at: number,
    threads: boolean,
    g0: number,
    g1: number,
    g2: number,
    t0: number,
    t1: number,
    t2: number,
  ): void {
    const c = this.#capture;
    if (c !== null) return c.opDispatch(at, threads, g0, g1, g2, t0, t1, t2);
    const w = this.#cb.writer!, words = w.words;
    words[at] = threads ? H_DISPATCH_THREADS : H_DISPATCH_GROUPS;
    words[at + 1] = g0;
    words[at + 2] = g1;
    words[at + 3] = g2;
    words[at + 4] = t0;
    words[at + 5] = t1;
    words[at + 6] = t2;
    words[at + 7] = this.#dispatches++;
    w.pos = at + 8;
    this.#pipeline = this.#opPipeline;
    this.#policy.dispatched();
    counterState.dispatches++;
  }

  /** Bookkeeping of a dispatch just written. */
  #dispatched(d: DispatchDescriptor): void {
    const p = d.pipeline;
    this.#pipeline = p.handle;
    if (this.#kernels !== null) this.#kernels.push({ kernel: p.name, opKind: d.opKind ?? p.contract.opKind });
    this.#dispatches++;
    this.#policy.dispatched();
    counterState.dispatches++;
  }

  /**
   * Throws exactly what {@link CommandEncoder.dispatch} would throw for this descriptor, and encodes
   * nothing: lets a caller check work before committing anything it depends on.
   */
  checkDispatch(d: DispatchDescriptor): void {
    if (this.#cb.state !== "encoding") throw this.#notEncoding("checkDispatch");
    this.#check(d);
  }

  /** Validates a descriptor; returns the stream words its records take. */
  #check(d: DispatchDescriptor): number {
    const p = d.pipeline;
    const slots = p.contract.slots;
    const bindings = d.bindings;
    if (bindings.length > slots.length) {
      throw new MlxError(
        "InvalidArgument",
        `${p.name}: ${bindings.length} bindings given, the kernel has ${slots.length} slots ` +
          `(${slots.map((s) => s.name).join(", ")})`,
      );
    }
    const g0 = dim(d.grid, 0), g1 = dim(d.grid, 1), g2 = dim(d.grid, 2);
    const t0 = dim(d.threadgroup, 0), t1 = dim(d.threadgroup, 1), t2 = dim(d.threadgroup, 2);
    if (!validDim(g0) || !validDim(g1) || !validDim(g2)) {
      throw new MlxError("InvalidArgument", `${p.name}: grid [${g0}, ${g1}, ${g2}] needs positive integers`);
    }
    if (!validDim(t0) || !validDim(t1) || !validDim(t2) || t0 * t1 * t2 > Limits.MAX_THREADS_PER_GROUP) {
      throw new MlxError(
        "InvalidArgument",
        `${p.name}: threadgroup [${t0}, ${t1}, ${t2}] needs positive integers with at most ` +
          `${Limits.MAX_THREADS_PER_GROUP} threads in all`,
      );
    }
    const tgMem = d.threadgroupMemory ?? 0;
    if ((tgMem >>> 0) !== tgMem || tgMem > Limits.MAX_TG_MEMORY) {
      throw new MlxError(
        "InvalidArgument",
        `${p.name}: threadgroup memory ${tgMem} must be an integer in 0..${Limits.MAX_TG_MEMORY}`,
      );
    }
    // Pass 1: validate every binding and size the records; nothing is written on failure.
    let words = RecordWords.SET_PIPELINE + RecordWords.SET_TG_MEMORY + RecordWords.DISPATCH;
    for (let i = 0; i < slots.length; i++) {
      const b = bindings[i];
      const s = slots[i]!;
      if (s.kind === "buffer") {
        if (b instanceof MlxBuffer) {
          if (b.rawHandle === 0) {
            throw new MlxError("Disposed", `${p.name}: slot ${i} (${s.name}) binds a disposed buffer`);
          }
          words += StreamWriter.bufferRecordWords(b.byteOffset, b.byteLength);
        } else if (b !== undefined || !s.optional) {
          throw new MlxError(
            "InvalidArgument",
            `${p.name}: slot ${i} (${s.name}) needs an MlxBuffer, got ${b === undefined ? "nothing" : "bytes"}`,
          );
        }
      } else if (Array.isArray(b)) {
        const n = b.length * 4;
        for (let k = 0; k < b.length; k++) {
          const v = b[k];
          if ((v >>> 0) !== v) {
            throw new MlxError(
              "InvalidArgument",
              `${p.name}: slot ${i} (${s.name}) word ${k} is ${v}, not a u32: encode floats with f32Bits()`,
            );
          }
        }
        this.#checkInlineSize(p.name, i, s, n);
        words += RecordWords.SET_BYTES_HEADER + b.length;
      } else if (b instanceof Uint32Array || b instanceof Uint8Array) {
        this.#checkInlineSize(p.name, i, s, b.byteLength);
        words += StreamWriter.bytesRecordWords(b.byteLength);
      } else {
        throw new MlxError(
          "InvalidArgument",
          `${p.name}: slot ${i} (${s.name}) needs inline constants (u32 words or bytes), got ${
            b === undefined ? "nothing" : "a buffer"
          }`,
        );
      }
    }
    return words;
  }

  /**
   * Makes every later dispatch see all memory written by earlier ones. A barrier before the first
   * dispatch is a no-op and is not counted.
   */
  memoryBarrier(): void {
    if (this.#cb.state !== "encoding") throw this.#notEncoding("memoryBarrier");
    this.#policy.forget(); // every earlier write is now visible
    this.#planTail = false;
    if (this.#capture !== null) {
      this.#capture.barrier(); // in capture mode a barrier is a node; nothing is issued or counted
      return;
    }
    const w = this.#cb.writer!;
    if (this.#dispatches === 0) {
      if (this.#nativeTracked) { // nothing to separate, but the native tracker forgets its ranges too
        w.reserve(RecordWords.BARRIER);
        w.barrier();
      }
      return;
    }
    w.reserve(RecordWords.BARRIER);
    w.barrier();
    this.#barrierIssued();
  }

  /** Bookkeeping of a barrier record just written (the tracker is reset by the caller or here). */
  #barrierIssued(): void {
    this.#policy.forget();
    this.#log?.push(BARRIER);
    this.#barriersBefore?.push(this.#dispatches);
    this.#barriers++;
    this.#policy.endGroup();
    counterState.barriers++;
  }

  // ---- auto barriers ------------------------------------------------------------------------

  /** Whether every dispatch is tracked and gets a barrier exactly on conflict. */
  get autoBarriers(): boolean {
    return this.#policy.auto;
  }

  /**
   * Turns automatic barriers on or off. The group's tracked accesses stay (only a barrier forgets
   * them): a dispatch after switching back on is checked against those from before the switch.
   * Dispatches encoded while off are not tracked: their barriers are the caller's.
   */
  set autoBarriers(on: boolean) {
    if (on === this.#policy.auto) return;
    this.#policy.auto = on;
    this.#capture?.setAutoBarriers(on); // the captured nodes take their barriers by this setting
    // The native setting is written lazily, before the next dispatch or range.
  }

  /**
   * Writes an AUTO_BARRIERS record (the native group stays). Turning tracking on after a cached
   * plan's untracked records puts a barrier first.
   */
  #writeAutoBarriers(on: boolean): void {
    if (on && this.#planTail) this.memoryBarrier();
    const cb = this.#cb, w = cb.writer!;
    w.reserve(RecordWords.AUTO_BARRIERS);
    w.words[w.pos++] = on ? H_AUTO_BARRIERS_ON : H_AUTO_BARRIERS_OFF;
    this.#nativeAuto = on;
    if (on) this.#nativeTracked = cb.nativeStats = true;
  }

  /**
   * Writes user ranges as TRACK records (with `check`, one record: the native decoder places a
   * barrier first if any conflicts). Ranges are checked as the JS policy checks them; a range of an
   * allocation that is no longer live (or of another device) is left out: no dispatch of this
   * command buffer can bind it any more. A range past its allocation's end is cut at the end.
   */
  #trackNative(reads: readonly RangeLike[], writes: readonly RangeLike[], check: boolean): void {
    const r = toRanges(reads), wr = toRanges(writes);
    checkRanges(r, check ? "barrier reads" : "tracked reads");
    checkRanges(wr, check ? "barrier writes" : "tracked writes");
    const n = r.length + wr.length;
    if (check && n > Limits.MAX_TRACK_ENTRIES) {
      throw new MlxError(
        "InvalidArgument",
        `barrierBetween: ${n} ranges, at most ${Limits.MAX_TRACK_ENTRIES} in one call: merge adjacent ranges`,
      );
    }
    if (this.#policy.auto !== this.#nativeAuto) this.#writeAutoBarriers(this.#policy.auto);
    const cb = this.#cb, w = cb.writer!, host = this.#host;
    const flags = check ? Track.CHECK : 0;
    let header = -1, k = 0;
    for (let i = 0; i < n; i++) {
      const isWrite = i >= r.length, range = isWrite ? wr[i - r.length]! : r[i]!;
      const live = liveAllocation(range[0], host);
      if (live === undefined) continue;
      const [, start, end] = cutAtAllocationEnd(range, live.byteLength);
      if (header < 0 || k === Limits.MAX_TRACK_ENTRIES) { // a new record (only without check: n fits one)
        if (header >= 0) w.words[header] = trackHeader(k);
        w.reserve(RecordWords.TRACK_HEADER + RecordWords.TRACK_ENTRY * Math.min(n - i, Limits.MAX_TRACK_ENTRIES));
        header = w.pos++;
        k = 0;
      }
      const at = w.pos;
      w.words[at] = live.handle;
      w.words[at + 1] = (isWrite ? Track.WRITE : Track.READ) | flags;
      w.words[at + 2] = start >>> 0;
      w.words[at + 3] = Math.floor(start / TWO_32);
      w.words[at + 4] = (end - start) >>> 0;
      w.words[at + 5] = Math.floor((end - start) / TWO_32);
      w.pos = at + RecordWords.TRACK_ENTRY;
      k++;
    }
    if (header >= 0) {
      w.words[header] = trackHeader(k);
      this.#nativeTracked = true;
      if (check) cb.nativeStats = true;
    } else if (check) {
      counterState.autoConcurrent++; // nothing to check: as the JS policy counts it
    }
  }

  /**
   * Hands the records written so far to the native decoder for its counts. A getter does not throw
   * a rejected stream's error: the command buffer keeps it, and the next call that encodes or
   * commits reports it.
   */
  #flushQuietly(): void {
    try {
      this.#cb.flush();
    } catch { /* kept by the command buffer (see above) */ }
  }

  /** Reads the native decoder's group sizes into the policy (after a flush). */
  #loadNativeGroups(): void {
    const cb = this.#cb;
    let total = cb.readStats(barrierStatsWords().length);
    if (total > barrierStatsWords().length) total = cb.readStats(total);
    this.#policy.loadNativeGroups(barrierStatsWords(), total);
  }

  /**
   * Places a barrier if a dispatch with these accesses would conflict with the current concurrent
   * group, then adds them to the group (the seed's barrier_between). In capture mode the ranges
   * also annotate the next captured dispatch.
   */
  barrierBetween(reads: readonly RangeLike[], writes: readonly RangeLike[]): void {
    if (this.#cb.state !== "encoding") throw this.#notEncoding("barrierBetween");
    if (this.#direct) return this.#trackNative(reads, writes, true);
    const r = this.#userRanges(reads), w = this.#userRanges(writes);
    this.#capture?.addPendingRanges({ reads: r, writes: w });
    this.#track(r, w, true);
  }

  /**
   * Adds a dispatch's accesses to the current group without a check (the seed's track_dispatch);
   * in capture mode they are merged into the last captured dispatch's accesses.
   */
  trackDispatch(reads: readonly RangeLike[], writes: readonly RangeLike[]): void {
    if (this.#cb.state !== "encoding") throw this.#notEncoding("trackDispatch");
    if (this.#direct) return this.#trackNative(reads, writes, false);
    const r = this.#userRanges(reads), w = this.#userRanges(writes);
    this.#capture?.mergeIntoLastDispatch({ reads: r, writes: w });
    this.#track(r, w, false);
  }

  /**
   * User ranges for the JS policy. Captured as given (a graph's ranges need no device). An encoder
   * that tracks in JS (validating or profiling) takes them as the native tracker does: ranges of
   * allocations that are not live on this device are left out (no dispatch can bind them) and the
   * rest are cut at their allocation's end, so both trackers place the same barriers. Malformed
   * ranges are kept for the tracker's own check to refuse.
   */
  #userRanges(list: readonly RangeLike[]): MemRange[] {
    if (this.#capture !== null) return toRanges(list);
    const out: MemRange[] = [];
    for (const x of list) {
      const range = x instanceof MlxBuffer ? x.range() : x;
      const live = Array.isArray(range) && Number.isInteger(range[0]) ? liveAllocation(range[0], this.#host) : null;
      if (live === undefined) continue; // a well-formed id of no live allocation here
      out.push(live === null || range[1] > range[2] ? range : cutAtAllocationEnd(range, live.byteLength));
    }
    return out;
  }

  #track(reads: readonly MemRange[], writes: readonly MemRange[], check: boolean): void {
    const policy = this.#policy;
    if (check) {
      const capturing = this.#capture !== null;
      const hasWork = capturing ? this.#capture!.length > 0 : this.#dispatches > 0;
      if (hasWork && policy.conflicts(reads, writes)) {
        this.memoryBarrier();
        if (!capturing) counterState.autoBarriers++;
      } else if (!capturing) {
        counterState.autoConcurrent++;
      }
    }
    policy.track(reads, writes);
  }

  /** The concurrent-group size histogram of what was encoded so far. */
  groupStats(): GroupStats {
    const cb = this.#cb;
    if (cb.nativeStats && cb.state === "encoding") { // after commit the policy holds the final sizes
      this.#flushQuietly();
      if (cb.state === "encoding") this.#loadNativeGroups();
    }
    return this.#policy.stats(this.#dispatches);
  }

  // ---- capture mode ---------------------------------------------------------------------------

  /**
   * Starts recording dispatches and barriers as graph nodes instead of encoding them. The nodes
   * {@link CommandEncoder.takeCapture} returns bind the very views the dispatches bound.
   */
  startCapture(): void {
    this.#startCapture("startCapture", true);
  }

  /**
   * @ignore Internal: starts a recording for the plan cache: its nodes, built only when needed, bind
   * views of the same bytes as the dispatches bound (no view is kept per binding while recording).
   */
  startCompactCapture(): void {
    this.#startCapture("beginRecorded", false);
  }

  #startCapture(what: string, keepCallerViews: boolean): void {
    if (this.#cb.state !== "encoding") throw this.#notEncoding(what);
    this.#capture ??= new CaptureRecorder(this.#policy.auto, keepCallerViews);
    this.#direct = this.#opPath = false;
  }

  /** Whether the encoder is recording. */
  get isCapturing(): boolean {
    return this.#capture !== null;
  }

  /** Ends capture mode and returns the recorded nodes (null when not capturing). */
  takeCapture(): CapturedNode[] | null {
    const capture = this.takeCompactCapture();
    if (capture === null) return null;
    const nodes = capture.nodes();
    capture.release();
    return nodes;
  }

  /** @ignore Internal: Ends capture mode and returns the recorded pass in compact form (null when not capturing). */
  takeCompactCapture(): Capture | null {
    const capture = this.#capture;
    this.#capture = null;
    // The group of what was encoded before the capture stays (JS policy or native tracker): the
    // captured nodes were not encoded, and a direct dispatch after them may still conflict with it.
    this.#direct = this.#native;
    this.#opPath = this.#direct && this.#kernels === null;
    return capture ? capture.take() : null;
  }

  /**
   * @ignore Internal: Appends the finished records of a cached plan to a fresh encoder (no dispatch
   * yet): `stream` (whole records) goes to the native library as one chunk, straight from the plan's
   * memory (no copy), holding `dispatches` dispatches in concurrent groups of `groupSizes` (a barrier
   * between each two), the last one on pipeline `lastPipeline`. Returns false, with nothing written,
   * where the encoder needs per-dispatch bookkeeping (validation, profiling) or already holds work;
   * throws (the command buffer then failed) when the native library refuses the stream.
   */
  appendPlanRecords(stream: Uint8Array, dispatches: number, groupSizes: Int32Array, lastPipeline: number): boolean {
    if (this.#cb.state !== "encoding") throw this.#notEncoding("appendPlanRecords");
    if (!this.#takesPlan()) return false;
    const tracking = this.#nativeAuto; // the plan carries its barriers: the decoder must not add any
    if (tracking) this.#writeAutoBarriers(false);
    this.#cb.encodeNow(stream); // flushes the writer (with the record above) before the plan's records
    this.#tookPlan(dispatches, groupSizes, lastPipeline);
    return true;
  }

  /**
   * @ignore Internal: {@link CommandEncoder.appendPlanRecords} from a template that decoded the
   * records already: they are copied natively, not decoded again. Returns false, with nothing
   * written, where appendPlanRecords would, and when the template was dropped.
   */
  appendTemplate(template: CommandTemplate): boolean {
    if (this.#cb.state !== "encoding") throw this.#notEncoding("appendTemplate");
    const ptr = template.ptr;
    // (a replay needs a command buffer with nothing decoded, tracking off)
    if (ptr === null || !this.#takesPlan() || this.#nativeTracked) return false;
    const [patch, words] = template.patchList();
    this.#cb.replayNow(ptr, patch, words);
    this.#tookPlan(template.dispatches, template.groupSizes, template.lastPipeline);
    return true;
  }

  /**
   * Whether a plan's records can be taken whole: no per-dispatch bookkeeping (validation,
   * profiling, capture) and nothing encoded yet.
   */
  #takesPlan(): boolean {
    return this.#log === null && this.#kernels === null && this.#barriersBefore === null && this.#capture === null &&
      this.#dispatches === 0 && this.#pipeline === 0;
  }

  /** The bookkeeping of a plan's records taken whole. */
  #tookPlan(dispatches: number, groupSizes: Int32Array, lastPipeline: number): void {
    // Tracking resumes with the next dispatch (if any), behind a barrier: the plan's accesses are
    // not in the decoder's group.
    this.#planTail = this.#direct && this.#policy.auto;
    const policy = this.#policy;
    for (let g = 0; g < groupSizes.length; g++) {
      if (g > 0) {
        this.#barriers++;
        policy.endGroup();
      }
      policy.dispatchedMany(groupSizes[g]!);
    }
    this.#dispatches = dispatches;
    this.#pipeline = lastPipeline;
    counterState.dispatches += dispatches;
    counterState.barriers += groupSizes.length > 0 ? groupSizes.length - 1 : 0;
  }

  /**
   * @ignore Internal: at commit, a whole stream that repeats one `repeats` remembers replays its
   * template instead of being decoded (direct encoders without profiling; others ignore it).
   */
  useStreamRepeats(repeats: StreamRepeats | null): void {
    this.#repeats = repeats;
  }

  /** Sets the op kind of the next captured dispatch. */
  setOpKind(kind: CapturedOpKind): void {
    this.#capture?.setOpKind(kind);
  }

  /**
   * Adds read/write ranges to the next captured dispatch. They are merged with the ranges derived
   * from its bindings, never replace them.
   */
  setPendingRanges(reads: readonly MemRange[], writes: readonly MemRange[]): void {
    this.#capture?.addPendingRanges({ reads, writes });
  }

  /** Annotates the last captured dispatch with these ranges if it has none. */
  annotateLastDispatchIfMissing(reads: readonly MemRange[], writes: readonly MemRange[]): void {
    this.#capture?.annotateLastDispatchIfMissing(reads, writes);
  }

  /** Resolves a pipeline reference (a Pipeline, or just `{ name }`) on this encoder's device. */
  resolvePipeline(ref: PipelineRef): Pipeline {
    return ref instanceof Pipeline ? ref : this.#host.kernels.get(ref.name);
  }

  /** Hazards found by the validator at the last commit (validation on). */
  get hazards(): readonly Hazard[] {
    return this.#hazards;
  }

  /** Hands every record written so far to the native library now. */
  flush(): void {
    this.#cb.flush();
  }

  /**
   * Commits the command buffer; it runs after every earlier commit of the device. With
   * `{ wait: true }` this blocks until it completed (same as {@link CommandEncoder.commitAndWait});
   * a string is taken as the label.
   */
  commit(options: CommitOptions | string = {}): void {
    const opts = typeof options === "string" ? { label: options } : options;
    if (opts.wait) {
      counterState.syncs++;
      this.#commit(opts.label ?? "");
      this.waitUntilCompleted();
    } else this.#commit(opts.label ?? "");
  }

  #commit(label: string): void {
    if (this.#cb.state !== "encoding") throw this.#notEncoding("commit");
    if (this.#capture !== null) {
      throw new MlxError(
        "InvalidState",
        "commit while capturing: takeCapture() first and encode the graph (or dispose the encoder)",
      );
    }
    this.#verify(label);
    this.#policy.endGroup();
    this.#policy.release(); // nothing more is tracked: the tracker goes to the next encoder
    this.#label = label;
    const cb = this.#cb;
    if (this.#direct && this.#kernels === null) cb.repeatsAtCommit = this.#repeats;
    cb.writer!.flush();
    cb.repeatsAtCommit = null;
    if (cb.nativeStats) this.#loadNativeGroups(); // the final counts, before the command buffer runs
    cb.closeStream();
    const rc = this.#sym.mlxn_cmdbuf_commit(cb.ptr!);
    if (rc !== Status.OK) {
      const err = new MlxError(codeOf(rc), `commit failed: ${lastErrorText(this.#sym)}`);
      cb.finish(err);
      throw err;
    }
    cb.state = "committed";
    counterState.commandBuffers++;
  }

  /**
   * Runs the hazard validator over what was encoded (validation on) and throws HazardError, with the
   * encoder disposed, if a barrier is missing; nothing is committed. A no-op without validation.
   */
  checkHazards(label = ""): void {
    if (this.#cb.state !== "encoding") throw this.#notEncoding("checkHazards");
    this.#verify(label);
  }

  #verify(label: string): void {
    if (this.#log === null) return;
    const where = `command buffer${label ? ` '${label}'` : ""}`;
    this.#hazards = findHazards(this.#log);
    if (this.#hazards.length > 0) {
      const err = new MlxError(
        "HazardError",
        `${this.#hazards.length} missing barrier(s) in ${where} (nothing was committed):\n${
          formatHazards(this.#hazards)
        }`,
      );
      this.dispose();
      throw err;
    }
    const broken = findBrokenConstantPromises(this.#log);
    if (broken.length > 0) {
      const err = new MlxError(
        "HazardError",
        `${broken.length} broken constant promise(s) in ${where} (nothing was committed; drop the promise, ` +
          `e.g. constantWeights, or write the buffer in an earlier command buffer):\n${formatBrokenPromises(broken)}`,
      );
      this.dispose();
      throw err;
    }
  }

  /** Commits and blocks until the command buffer completed; throws CommandBufferError on failure. */
  commitAndWait(options: Omit<CommitOptions, "wait"> | string = {}): void {
    this.commit({ ...(typeof options === "string" ? { label: options } : options), wait: true });
  }

  /** Blocks until the committed command buffer completed; throws its error if it failed. */
  waitUntilCompleted(): void {
    if (this.#cb.state === "committed") {
      const ptr = this.#cb.ptr!, spinUs = this.#host.waitSpinUs;
      if (spinUs > 0) { // poll first (DeviceOptions.waitSpinUs): the thread stays on an awake core
        const until = performance.now() + spinUs / 1000;
        while (this.#sym.mlxn_cmdbuf_status(ptr) === CbStatus.COMMITTED && performance.now() < until);
      }
      const rc = this.#sym.mlxn_cmdbuf_wait(ptr);
      if (this.#cb.state === "committed") this.#complete(rc);
    } else if (this.#cb.state === "encoding") {
      throw new MlxError("InvalidState", "waitUntilCompleted before commit: commit the command buffer first");
    }
    if (this.#cb.error) throw this.#cb.error;
  }

  /** Resolves when the committed command buffer completed, without blocking the event loop. */
  async completed(): Promise<void> {
    const cb = this.#cb;
    if (cb.state === "encoding") {
      throw new MlxError("InvalidState", "completed() before commit: commit the command buffer first");
    }
    if (cb.state === "committed") {
      cb.asyncWaits++;
      let rc: number;
      try {
        rc = await this.#sym.mlxn_cmdbuf_wait_async(cb.ptr!);
      } finally {
        cb.asyncWaits--;
      }
      if (cb.state === "committed") this.#complete(rc);
      else cb.freeNativeIfIdle();
    }
    if (cb.error) throw cb.error;
  }

  /** GPU (backend clock) start of execution in ns; 0 until completed. */
  get gpuStartNs(): number {
    return this.#gpuStartNs;
  }

  /** GPU end of execution in ns; 0 until completed. */
  get gpuEndNs(): number {
    return this.#gpuEndNs;
  }

  /** GPU execution time in ns; 0 until completed. */
  get gpuNs(): number {
    return this.#gpuEndNs - this.#gpuStartNs;
  }

  /** Per-dispatch timings, when the device profiles dispatches (MLXN_PROFILE=dispatch). */
  get dispatchTimings(): readonly DispatchTiming[] | null {
    return this.#timings;
  }

  /**
   * Releases the command buffer. An uncommitted one is dropped without running (releasing every
   * buffer it bound); a committed one is waited for first.
   */
  dispose(): void {
    const cb = this.#cb;
    if (cb.state === "disposed") return;
    this.#capture?.discard();
    this.#capture = null;
    this.#policy.release();
    if (cb.state === "encoding") {
      if (cb.nativeStats && !this.#host.closed) {
        // The counters count the barriers of what was written, as when the JS policy placed them.
        try {
          cb.flush();
          cb.readStats(Stat.COUNT);
        } catch { /* a rejected stream: its error stays with this encoder */ }
      }
      cb.closeStream();
    } else if (cb.state === "committed" && !this.#host.closed) {
      const rc = this.#sym.mlxn_cmdbuf_wait(cb.ptr!);
      if (cb.state === "committed") this.#complete(rc);
    }
    cb.state = "disposed";
    cb.freeNativeIfIdle();
  }

  /** Same as {@link CommandEncoder.dispose}. */
  [Symbol.dispose](): void {
    this.dispose();
  }

  #complete(rc: number): void {
    const sym = this.#sym, ptr = this.#cb.ptr!;
    const n = this.#kernels ? this.#dispatches : 0;
    // Typed-array allocation is costly in Deno: reuse a scratch unless per-dispatch timings are on.
    const out = n === 0 ? timingScratch : new BigUint64Array(2 + 3 * n);
    const got = sym.mlxn_cmdbuf_timings(ptr, out, out.length);
    this.#gpuStartNs = Number(out[0]);
    this.#gpuEndNs = Number(out[1]);
    if (this.#kernels) {
      const t: DispatchTiming[] = [];
      for (let i = 0; i < got; i++) {
        const tag = Number(out[2 + 3 * i]);
        const k = this.#kernels[tag];
        t.push({
          index: tag,
          kernel: k?.kernel ?? "?",
          opKind: k?.opKind ?? "?",
          startNs: Number(out[3 + 3 * i]),
          endNs: Number(out[4 + 3 * i]),
        });
      }
      this.#timings = t;
    }
    this.#host.profiler?.record({
      label: this.#label,
      startNs: this.#gpuStartNs,
      endNs: this.#gpuEndNs,
      dispatches: this.#timings ?? [],
      barriersBefore: this.#barriersBefore ?? [],
    });
    let err: MlxError | null = null;
    if (rc !== Status.OK || sym.mlxn_cmdbuf_status(ptr) === CbStatus.ERROR) {
      const text = readText((b, cap) => sym.mlxn_cmdbuf_error(ptr, b, cap));
      err = new MlxError(
        "CommandBufferError",
        `command buffer${this.#label ? ` '${this.#label}'` : ""} failed: ${text || lastErrorText(sym)}`,
      );
    }
    this.#cb.finish(err);
  }

  #checkInlineSize(kernel: string, i: number, s: SlotSpec, n: number): void {
    if (n === 0 || n > Limits.MAX_INLINE_BYTES || (s.size !== undefined && n !== s.size)) {
      throw new MlxError(
        "InvalidArgument",
        `${kernel}: slot ${i} (${s.name}) takes ${s.size ?? `1..${Limits.MAX_INLINE_BYTES}`} inline bytes, got ${n}`,
      );
    }
  }

  #notEncoding(what: string): MlxError {
    const cb = this.#cb;
    if (cb.state === "disposed") {
      return new MlxError("Disposed", `${what}: this command encoder was disposed; create a new one`);
    }
    if (cb.rejected && cb.error !== null) {
      return new MlxError(
        cb.error.code,
        `${what}: this command buffer's stream was rejected (${cb.error.message}); create a new encoder`,
      );
    }
    return new MlxError(
      "InvalidState",
      `${what}: this command buffer was already committed (${this.#cb.state}); ` +
        `create a new encoder with device.commandEncoder()`,
    );
  }
}
