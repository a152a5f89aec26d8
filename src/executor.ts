/**
 * GraphExecutor and GraphSession: one forward pass = one session = one command buffer (two with the
 * dual-buffer split). A session either encodes directly (`begin`) or records a graph (`beginRecorded`)
 * that `finish` optimises — fusion, reorder, barriers recomputed from ranges — and replays.
 *
 * @module
 */

import { CommandTemplate, sessionRepeats, StreamRepeats } from "./command_template.ts";
import { envConfig } from "./config.ts";
import { counterState } from "./counters.ts";
import type { MlxDevice } from "./device.ts";
import type { CommandEncoder, DispatchDescriptor, RangeLike } from "./encoder.ts";
import { MlxError } from "./errors.ts";
import { checkChunk, ComputeGraph, encodeChunk } from "./graph/compute_graph.ts";
import type { Capture } from "./capture_recorder.ts";
import { disposalCount, type MlxBuffer } from "./buffer.ts";
import type { CapturedNode } from "./graph/nodes.ts";
import {
  type CachedPlan,
  Fingerprint,
  hitTemplate,
  PlanCache,
  planDescriptor,
  PlanRecorder,
  type PlanRecords,
  RecordsBuilder,
  replaySteps,
} from "./plan_cache.ts";
import type { KernelRegistry } from "./kernels.ts";
import type { DispatchTarget } from "./ops/common.ts";
import { type AnyOp, SESSION_OPS, sessionMethod, type SessionOps } from "./session_ops.ts";

/** Optimisations and checks, as executor defaults (the environment's kill switches always win). */
export interface ExecutorOptions {
  /** Allow the fusion pass (MLXN_FUSION=0 forbids it). */
  fusion?: boolean | undefined;
  /** Allow the reorder pass (MLXN_REORDER=0 forbids it). */
  reorder?: boolean | undefined;
  /** Validate every command buffer for missing barriers (MLXN_VALIDATE=1). */
  validate?: boolean | undefined;
  /**
   * Sessions insert barriers automatically, exactly where accesses conflict (default on). With
   * `false`, barriers are placed by hand (`s.barrier()`), and the validator (MLXN_VALIDATE=1)
   * still reports any that are missing.
   */
  autoBarriers?: boolean | undefined;
  /**
   * Cache optimised recorded passes by topology and replay them (default on; MLXN_PLAN_CACHE=0
   * forbids it). See src/plan_cache.ts for the key.
   */
  planCache?: boolean | undefined;
  /** Most cached plans, least recently used evicted first (default 16). */
  planCacheSize?: number | undefined;
}

/** Options of one session. */
export interface SessionOptions {
  /** Insert barriers automatically (default: the executor's setting, itself on by default). */
  autoBarriers?: boolean | undefined;
  /** Validate hazards at commit (default: the executor's setting). */
  validate?: boolean | undefined;
  /**
   * Direct sessions of a loop whose passes repeat (a token loop): when this pass's command stream
   * differs from an earlier one of the same length only in inline constants and the offsets and
   * lengths of buffer views (a position, the KV-cache row a token writes), it replays that pass's
   * decoded commands with those values patched and the patched dispatches validated again, instead
   * of being decoded whole. Passes that differ otherwise are decoded as usual. Up to four earlier
   * passes of distinct lengths are kept per executor (their buffers are let go as soon as any of them
   * is freed). Off by default, and whatever this says when `MLXN_PLAN_CACHE=0`.
   */
  reuse?: boolean | undefined;
}

/** What `finish` / `commit` should do; every flag defaults to off. */
export interface FinishOptions {
  /** Run the fusion pass (recorded sessions). */
  fuse?: boolean | undefined;
  /** Run the reorder pass; barriers are then recomputed from ranges (recorded sessions). */
  reorder?: boolean | undefined;
  /** Split over two command buffers, the first committed while the second is encoded (recorded). */
  dualBuffer?: boolean | undefined;
  /** Label of the command buffer(s). */
  label?: string | undefined;
}

/** What a finished pass did and how long it took. */
export interface FinishReport {
  /** "direct" or "recorded". */
  readonly mode: "direct" | "recorded";
  /**
   * Recorded passes: "hit" when the pass replayed the cached plan of its topology (no fusion,
   * reorder or barrier placement ran), "miss" when it was optimised and its plan cached; "off" for
   * direct passes and when the plan cache is switched off. A {@link FrozenPass}'s commits, whatever
   * the plan cache: "miss" for the first (the freeze optimised it), "hit" for every later one.
   */
  readonly planCache: PlanCacheOutcome;
  /** Fusions applied. */
  readonly fusions: number;
  /** Nodes moved by the reorder pass. */
  readonly reordered: number;
  /** Barriers issued, per command buffer. */
  readonly barriers: readonly number[];
  /** Dispatches encoded. */
  readonly dispatches: number;
  /** Concurrent groups (runs of dispatches between barriers), over all command buffers. */
  readonly groups: number;
  /** Host time from session begin to the last commit, ns. */
  readonly encodingNs: number;
  /** Host time from the last commit to completion, ns (0 until waited). */
  readonly gpuWaitNs: number;
  /** Device execution time summed over the command buffers, ns (0 until waited). */
  readonly gpuNs: number;
}

/** Whether a recorded pass replayed a cached plan ("hit"), optimised and cached one ("miss"), or neither ("off"). */
export type PlanCacheOutcome = "hit" | "miss" | "off";

interface RecordedCommit {
  encoders: CommandEncoder[];
  barriers: number[];
  fusions: number;
  reordered: number;
  planCache: PlanCacheOutcome;
}

/** A committed pass that has not been waited for. */
export interface PendingPass {
  /** The committed encoders, in commit order. */
  readonly encoders: readonly CommandEncoder[];
  /** Blocks until every command buffer completed; throws CommandBufferError on failure. */
  wait(): FinishReport;
  /** Resolves when every command buffer completed. */
  completed(): Promise<FinishReport>;
}

const nowNs = () => performance.now() * 1e6;

/** Appends plan records to an empty encoder; false when it cannot take them (it then holds nothing new). */
function appendRecords(enc: CommandEncoder, r: PlanRecords): boolean {
  return enc.appendPlanRecords(r.bytes, r.dispatches, r.groupSizes, r.lastPipeline);
}

const DEFAULT_PLAN_CACHE_SIZE = 16;

function closedSessionError(what: string): MlxError {
  return new MlxError("InvalidState", `${what}: this session was already finished or disposed; begin a new one`);
}

/** The base of GraphSession: its op methods are installed from SESSION_OPS (typed as SessionOps). */
export const SessionOpSurface: new () => SessionOps = class {} as new () => SessionOps;

/**
 * Runs forward passes on one device: every op of a pass goes through one session into one
 * command buffer.
 *
 * @example
 * ```ts
 * import { DType, GraphExecutor, MlxDevice } from "@mlxn/mlx-native";
 * using device = MlxDevice.open();
 * const exec = new GraphExecutor(device);
 * using a = device.upload(new Float32Array([1, 2])), b = device.upload(new Float32Array([3, 4]));
 * using out = device.alloc(8, DType.F32);
 * using s = exec.beginRecorded();
 * s.elementwiseAdd(a, b, out);
 * const report = s.finish({ fuse: true, reorder: true, dualBuffer: true });
 * console.log(out.read(), report.barriers);
 * ```
 */
export class GraphExecutor {
  /** The device. */
  readonly device: MlxDevice;
  /** Its kernel registry. */
  readonly registry: KernelRegistry;
  /** Resolved defaults. */
  readonly options: Readonly<Required<ExecutorOptions>>;
  /** Optimised recorded passes by topology (null when the plan cache is off). */
  readonly planCache: PlanCache | null;
  /** @ignore Internal: Scratch for topology keys. */
  readonly fingerprint: Fingerprint = new Fingerprint();
  #repeats: StreamRepeats | null = null;

  /** An executor on `device`. */
  constructor(device: MlxDevice, options: ExecutorOptions = {}) {
    const env = envConfig();
    this.device = device;
    this.registry = device.kernels;
    const size = options.planCacheSize ?? DEFAULT_PLAN_CACHE_SIZE;
    if (!Number.isSafeInteger(size) || size < 0) {
      throw new MlxError("InvalidArgument", `planCacheSize must be a non-negative integer, got ${size}`);
    }
    // MLXN_PLAN_CACHE=0 forbids the cache whatever the option says.
    const envAllows = env.planCache;
    this.options = Object.freeze({
      fusion: env.fusion && (options.fusion ?? true),
      reorder: env.reorder && (options.reorder ?? true),
      validate: options.validate ?? device.validate,
      autoBarriers: options.autoBarriers ?? true,
      planCache: envAllows && (options.planCache ?? true) && size > 0,
      planCacheSize: size,
    });
    this.planCache = this.options.planCache ? new PlanCache(size) : null;
  }

  /** A session that encodes every op directly into its command buffer. */
  begin(options: SessionOptions = {}): GraphSession {
    return new GraphSession(this, false, options);
  }

  /** A session that records a graph; `finish` optimises and replays it. */
  beginRecorded(options: SessionOptions = {}): GraphSession {
    return new GraphSession(this, true, options);
  }

  /** @ignore Internal: the passes of sessions begun with `reuse` (null when the plan cache env forbids it). */
  streamRepeats(): StreamRepeats | null {
    if (!envConfig().planCache) return null;
    return this.#repeats ??= new StreamRepeats(this.device);
  }
}

/**
 * One forward pass. Every op method encodes (or records) into the session's single encoder; call
 * `finish()` once. A session disposed or dropped without finishing releases its command buffer
 * without running it. The op methods (`s.elementwiseAdd`, `s.rmsNorm`, …) are the dispatchers of
 * `SESSION_OPS` (src/session_ops.ts) bound to this session: the same arguments as `ops.*` without
 * target and registry.
 */
export class GraphSession extends SessionOpSurface implements DispatchTarget {
  // Each op of SESSION_OPS becomes a method that checks the session is open and calls the op with
  // the session's encoder and registry (see sessionMethod).
  static {
    const encoderOf = (s: GraphSession, name: string): CommandEncoder => {
      if (s.#done) throw closedSessionError(name);
      return s.#encoder;
    };
    const registryOf = (s: GraphSession): KernelRegistry => s.#registry;
    const isSession = (x: unknown): boolean => typeof x === "object" && x !== null && #done in x;
    for (const [name, op] of Object.entries(SESSION_OPS)) {
      const method = sessionMethod(name, op as AnyOp, encoderOf, registryOf, isSession);
      Object.defineProperty(GraphSession.prototype, name, { value: method, writable: true, configurable: true });
    }
  }

  readonly #exec: GraphExecutor;
  readonly #registry: KernelRegistry;
  readonly #recorded: boolean;
  readonly #validate: boolean;
  readonly #began = nowNs();
  #encoder: CommandEncoder;
  #done = false;

  /** @ignore Internal: Use GraphExecutor.begin / beginRecorded. */
  constructor(exec: GraphExecutor, recorded: boolean, options: SessionOptions) {
    super();
    this.#exec = exec;
    this.#registry = exec.registry;
    this.#recorded = recorded;
    this.#validate = options.validate ?? exec.options.validate ?? false;
    this.#encoder = exec.device.commandEncoder({
      autoBarriers: options.autoBarriers ?? exec.options.autoBarriers,
      validate: this.#validate,
    });
    if (recorded) this.#encoder.startCompactCapture();
    else this.#encoder.useStreamRepeats(options.reuse ? exec.streamRepeats() : sessionRepeats.get(options) ?? null);
  }

  /** Whether this session records a graph. */
  get isRecording(): boolean {
    return this.#recorded;
  }

  /** The session's encoder: the escape hatch for ops without a session method. */
  get encoder(): CommandEncoder {
    this.#assertOpen("encoder");
    return this.#encoder;
  }

  /** Encodes (or records) one dispatch. */
  dispatch(d: DispatchDescriptor): void {
    this.#assertOpen("dispatch");
    this.#encoder.dispatch(d);
  }

  /** A memory barrier. */
  barrier(): void {
    this.#assertOpen("barrier");
    this.#encoder.memoryBarrier();
  }

  /** Same as {@link GraphSession.barrier} (the DispatchTarget name). */
  memoryBarrier(): void {
    this.barrier();
  }

  /** Barrier only if these accesses conflict with the current concurrent group. */
  barrierBetween(reads: readonly RangeLike[], writes: readonly RangeLike[]): void {
    this.#assertOpen("barrierBetween");
    this.#encoder.barrierBetween(reads, writes);
  }

  /** Adds accesses to the current group without a check. */
  trackDispatch(reads: readonly RangeLike[], writes: readonly RangeLike[]): void {
    this.#assertOpen("trackDispatch");
    this.#encoder.trackDispatch(reads, writes);
  }

  // ---- completion -------------------------------------------------------------------------------

  /** Commits the pass (optimised as asked, for recorded sessions) and waits for it. */
  finish(options: FinishOptions = {}): FinishReport {
    return this.commit(options).wait();
  }

  /** Commits the pass without waiting. */
  commit(options: FinishOptions = {}): PendingPass {
    this.#assertOpen("commit");
    this.#done = true;
    const enc = this.#encoder;
    const label = options.label ?? "";
    let fusions = 0, reordered = 0;
    let encoders: CommandEncoder[];
    let barriers: number[];
    let planCache: PlanCacheOutcome = "off";
    try {
      if (!this.#recorded) {
        enc.commit(label);
        encoders = [enc];
        barriers = [enc.barrierCount];
      } else {
        const r = this.#commitRecorded(enc, options, label);
        ({ encoders, barriers, fusions, reordered, planCache } = r);
      }
    } catch (e) {
      enc.dispose();
      throw e;
    }
    return pendingPass(encoders, {
      mode: this.#recorded ? "recorded" : "direct",
      planCache,
      fusions,
      reordered,
      barriers,
      began: this.#began,
    });
  }

  /**
   * Ends a recorded session without committing it: the pass is optimised as `commit(options)` would
   * optimise it (fusion, reorder, barriers, dual-buffer split) and returned as a {@link FrozenPass},
   * whose every `commit` submits that same optimised command stream again with no encoding. Use it
   * for a pass that is identical every time it runs — a token step driven by the step state: the
   * buffers it binds and its constants are fixed at freeze time (what they contain may change).
   */
  freeze(options: FinishOptions = {}): FrozenPass {
    this.#assertOpen("freeze");
    if (!this.#recorded) {
      throw new MlxError(
        "InvalidState",
        "freeze: only a recorded session can be frozen; begin it with beginRecorded()",
      );
    }
    this.#done = true;
    const enc = this.#encoder;
    try {
      const capture = this.#takeCapture(enc, "freeze");
      try {
        return this.#freeze(enc, capture, options);
      } finally {
        capture.release();
      }
    } finally {
      enc.dispose();
    }
  }

  /** The session's capture; an MlxError when it was taken through the `encoder` escape hatch. */
  #takeCapture(enc: CommandEncoder, what: string): Capture {
    const capture = enc.takeCompactCapture();
    if (capture === null) {
      throw new MlxError(
        "InvalidState",
        `${what}: this recorded session's capture was already taken through s.encoder; record the pass again`,
      );
    }
    return capture;
  }

  /**
   * Ends a recorded session without committing it and says whether its pass is exactly `frozen`'s:
   * the same commands, bound ranges, inline constants and user ranges, so that committing `frozen`
   * does what this session would have done.
   */
  isSamePass(frozen: FrozenPass): boolean {
    this.#assertOpen("isSamePass");
    if (!this.#recorded) {
      throw new MlxError("InvalidState", "isSamePass: only a recorded session (beginRecorded) can be compared");
    }
    this.#done = true;
    const enc = this.#encoder;
    try {
      const capture = this.#takeCapture(enc, "isSamePass");
      try {
        const key = frozenKeys.get(frozen)!;
        if (capture.length !== key.words.length) return false;
        const w = capture.words, k = key.words;
        for (let i = 0; i < k.length; i++) if (w[i] !== k[i]) return false;
        const fp = new Fingerprint();
        fp.compute(capture, 0);
        const extra = fp.view();
        return extra.length === key.extra.length && extra.every((v, i) => v === key.extra[i]);
      } finally {
        capture.release();
      }
    } finally {
      enc.dispose();
    }
  }

  #freeze(enc: CommandEncoder, capture: Capture, options: FinishOptions): FrozenPass {
    const exec = this.#exec;
    const nodes = capture.nodes();
    const graph = new ComputeGraph(nodes);
    const fusions = (options.fuse ?? false) && exec.options.fusion ? graph.fuse(this.#registry) : 0;
    const reorder = (options.reorder ?? false) && exec.options.reorder;
    const reordered = reorder ? graph.reorder() : 0;
    const recorder = new PlanRecorder(nodes);
    const build = () => new RecordsBuilder((p) => enc.resolvePipeline(p), (d) => enc.checkDispatch(d));
    const records: PlanRecords[] = [];
    let barriers: number[];
    if (!(options.dualBuffer ?? false)) {
      const b = build();
      barriers = [reorder ? graph.encodeWithBarriers(recorder.wrap(b)) : graph.encodeSequential(recorder.wrap(b))];
      recorder.firstSteps = recorder.steps.length;
      const r = recorder.traceable ? b.finish(recorder.steps, capture) : null;
      if (r !== null) records.push(r);
    } else {
      const [c0, c1] = graph.dualBufferChunks();
      const b0 = build(), n0 = encodeChunk(c0, recorder.wrap(b0));
      const split = recorder.firstSteps = recorder.steps.length;
      const r0 = recorder.traceable ? b0.finish(recorder.steps, capture) : null;
      const b1 = build(), n1 = encodeChunk(c1, recorder.wrap(b1));
      const r1 = recorder.traceable ? b1.finish(recorder.steps.slice(split), capture) : null;
      barriers = [n0, n1];
      if (r0 !== null && r1 !== null) records.push(r0, r1);
    }
    const fp = new Fingerprint();
    fp.compute(capture, 0);
    const key = { words: capture.words.slice(0, capture.length), extra: fp.view().slice() };
    // Without validation or dispatch profiling, the records are decoded once here and copied at each commit.
    const templates = records.length > 0 && !this.#validate && !exec.device.profileDispatches
      ? templatesOf(exec.device, records)
      : null;
    const frozen = new FrozenPass(exec.device, {
      templates,
      validate: this.#validate,
      label: options.label ?? "",
      buffers: capture.boundBuffers(),
      nodes,
      plan: {
        steps: recorder.steps,
        firstSteps: recorder.firstSteps,
        dualBuffer: options.dualBuffer ?? false,
        barriers,
        fusions,
        reordered,
        records: records.length > 0 ? records : null,
      },
    });
    frozenKeys.set(frozen, key);
    return frozen;
  }

  /**
   * Optimises and encodes a recorded pass, or replays the cached plan of its topology, then commits.
   * All or nothing: a failure commits nothing (the caller disposes `enc`).
   */
  #commitRecorded(enc: CommandEncoder, options: FinishOptions, label: string): RecordedCommit {
    const capture = this.#takeCapture(enc, "commit");
    try {
      return this.#encodeRecorded(enc, capture, options, label);
    } finally {
      capture.release();
    }
  }

  #encodeRecorded(enc: CommandEncoder, capture: Capture, options: FinishOptions, label: string): RecordedCommit {
    const exec = this.#exec;
    enc.autoBarriers = false; // the graph carries its barriers (or they are recomputed)
    const fuse = (options.fuse ?? false) && exec.options.fusion;
    const reorder = (options.reorder ?? false) && exec.options.reorder;
    const dual = options.dualBuffer ?? false;
    const cache = exec.planCache;
    let plan: CachedPlan | undefined;
    const fp = exec.fingerprint;
    if (cache !== null) {
      fp.compute(capture, (fuse ? 1 : 0) | (reorder ? 2 : 0) | (dual ? 4 : 0));
      plan = cache.lookup(fp);
      if (plan) counterState.planCacheHits++;
      else counterState.planCacheMisses++;
    }
    // A hit on a plan with records: copy them with this pass's constants (no graph is built).
    if (plan !== undefined && plan.records !== null) return this.#replayRecords(enc, capture, plan, label);
    const nodes = capture.nodes();
    const recorder = cache !== null && plan === undefined && cache.shouldRecord(fp) ? new PlanRecorder(nodes) : null;
    // With validation on, both command buffers are validated before either is committed.
    const deferFirst = this.#validate;
    let barriers: number[];
    let encoders: CommandEncoder[];
    let fusions = 0, reordered = 0;
    let records: readonly PlanRecords[] | null = null;
    if (!dual) {
      if (plan) {
        replaySteps(plan, nodes, enc, 0, plan.steps.length);
        barriers = [...plan.barriers];
      } else {
        const graph = new ComputeGraph(nodes);
        if (fuse) fusions = graph.fuse(this.#registry);
        if (reorder) reordered = graph.reorder();
        if (recorder !== null) {
          // Encoded once into plan records, which the encoder then takes by copying, as on a hit.
          const builder = new RecordsBuilder((p) => enc.resolvePipeline(p), (d) => enc.checkDispatch(d));
          const target = recorder.wrap(builder);
          barriers = [reorder ? graph.encodeWithBarriers(target) : graph.encodeSequential(target)];
          const r = recorder.traceable ? builder.finish(recorder.steps, capture) : null;
          if (r === null || !appendRecords(enc, r)) replaySteps(recorder, nodes, enc, 0, recorder.steps.length);
          records = r === null ? null : [r];
        } else {
          barriers = [reorder ? graph.encodeWithBarriers(enc) : graph.encodeSequential(enc)];
        }
      }
      enc.commit(label);
      encoders = [enc];
    } else {
      const second = exec.device.commandEncoder({ validate: this.#validate });
      try {
        const firstCommit = () => deferFirst ? enc.checkHazards(label) : enc.commit(label);
        if (plan) {
          const steps = plan.steps, split = plan.firstSteps;
          replaySteps(plan, nodes, enc, 0, split);
          for (let i = split; i < steps.length; i++) {
            const st = steps[i];
            if (st) second.checkDispatch(planDescriptor(st, nodes));
          }
          firstCommit();
          replaySteps(plan, nodes, second, split, steps.length);
          barriers = [...plan.barriers];
        } else {
          const graph = new ComputeGraph(nodes);
          if (fuse) fusions = graph.fuse(this.#registry);
          if (reorder) reordered = graph.reorder();
          const [c0, c1] = graph.dualBufferChunks();
          if (recorder !== null) {
            // Each chunk is encoded once into plan records, which its encoder then takes by copying.
            const build0 = new RecordsBuilder((p) => enc.resolvePipeline(p), (d) => enc.checkDispatch(d));
            const b0 = encodeChunk(c0, recorder.wrap(build0));
            const split = recorder.firstSteps = recorder.steps.length;
            const r0 = recorder.traceable ? build0.finish(recorder.steps, capture) : null;
            // All or nothing: the second buffer's dispatches are checked before the first commits.
            checkChunk(c1, second);
            if (r0 === null || !appendRecords(enc, r0)) replaySteps(recorder, nodes, enc, 0, split);
            firstCommit();
            const build1 = new RecordsBuilder((p) => second.resolvePipeline(p), (d) => second.checkDispatch(d));
            const b1 = encodeChunk(c1, recorder.wrap(build1));
            const r1 = recorder.traceable ? build1.finish(recorder.steps.slice(split), capture) : null;
            if (r1 === null || !appendRecords(second, r1)) {
              replaySteps(recorder, nodes, second, split, recorder.steps.length);
            }
            barriers = [b0, b1];
            records = r0 !== null && r1 !== null ? [r0, r1] : null;
          } else {
            const b0 = encodeChunk(c0, enc);
            // All or nothing: the second buffer's dispatches are checked before the first commits.
            checkChunk(c1, second);
            firstCommit();
            barriers = [b0, encodeChunk(c1, second)];
          }
        }
        if (deferFirst) {
          second.checkHazards(label);
          enc.commit(label);
        }
        second.commit(label);
      } catch (e) {
        second.dispose();
        throw e;
      }
      encoders = [enc, second];
    }
    if (plan) {
      fusions = plan.fusions;
      reordered = plan.reordered;
    } else if (recorder !== null && recorder.traceable) {
      cache!.store(fp, {
        steps: recorder.steps,
        firstSteps: dual ? recorder.firstSteps : recorder.steps.length,
        dualBuffer: dual,
        barriers,
        fusions,
        reordered,
        records,
      });
    }
    return { encoders, barriers, fusions, reordered, planCache: cache === null ? "off" : plan ? "hit" : "miss" };
  }

  /**
   * Replays a cached plan's records (one per command buffer) with this pass's constants and commits
   * them. Every command buffer is encoded (and, with validation on, checked) before the first commits:
   * all or nothing.
   */
  #replayRecords(enc: CommandEncoder, capture: Capture, plan: CachedPlan, label: string): RecordedCommit {
    const encoders = [enc];
    try {
      for (let c = 1; c < plan.records!.length; c++) {
        encoders.push(this.#exec.device.commandEncoder({ validate: this.#validate }));
      }
      // Validating and profiling encoders take no template (they need every dispatch): make none.
      const device = this.#exec.device;
      const templates = this.#validate || device.profileDispatches
        ? null
        : plan.records!.map((r) => hitTemplate(device, r));
      commitPlan(plan, encoders, () => capture.nodes(), this.#validate, label, templates);
    } catch (e) {
      for (let c = 1; c < encoders.length; c++) encoders[c]!.dispose();
      capture.boundBuffers(); // throws Disposed if a buffer was disposed: the likely cause, said plainly
      throw e;
    }
    return {
      encoders,
      barriers: [...plan.barriers],
      fusions: plan.fusions,
      reordered: plan.reordered,
      planCache: "hit",
    };
  }

  /** Releases the command buffer if the session was never finished (nothing runs). */
  dispose(): void {
    if (this.#done) return;
    this.#done = true;
    this.#encoder.dispose();
  }

  /** Same as {@link GraphSession.dispose}. */
  [Symbol.dispose](): void {
    this.dispose();
  }

  #assertOpen(what: string): void {
    if (this.#done) throw closedSessionError(what);
  }
}

/**
 * Throws Disposed when one of `buffers` was disposed (`fix` is appended to the message). Run after
 * a replay failed, not before every replay: the native library refuses a freed (stale) handle in a
 * stream before anything of the pass commits, and this names the cause.
 */
function assertBuffersLive(buffers: readonly MlxBuffer[], fix: string): void {
  for (let i = 0; i < buffers.length; i++) {
    if (buffers[i]!.rawHandle === 0) {
      throw new MlxError("Disposed", `a buffer this pass binds (allocation ${buffers[i]!.allocId}) was disposed${fix}`);
    }
  }
}

/**
 * Encodes command buffer c of `plan` into `encoders[c]`: its records copied (a plan-cache hit
 * wrote the pass's constants into them while comparing its key), or, where an encoder cannot take
 * records (validation on), its steps replayed with the bindings of `nodes()`. Then checks
 * (validation on) and commits them all: nothing is committed unless every one encoded.
 */
function commitPlan(
  plan: CachedPlan,
  encoders: readonly CommandEncoder[],
  nodes: () => readonly CapturedNode[],
  validate: boolean,
  label: string,
  templates: readonly (CommandTemplate | null)[] | null = null,
): void {
  for (let c = 0; c < encoders.length; c++) {
    const enc = encoders[c]!, r = plan.records?.[c], t = templates?.[c];
    if (t && enc.appendTemplate(t)) continue;
    if (r === undefined || !appendRecords(enc, r)) {
      const last = c === encoders.length - 1;
      replaySteps(plan, nodes(), enc, c === 0 ? 0 : plan.firstSteps, last ? plan.steps.length : plan.firstSteps);
    }
  }
  if (validate) { for (const e of encoders) e.checkHazards(label); }
  for (const e of encoders) e.commit(label);
}

/** What a report says besides its times. */
interface PassSummary {
  mode: "direct" | "recorded";
  planCache: PlanCacheOutcome;
  fusions: number;
  reordered: number;
  barriers: number[];
  /** When encoding began, ns. */
  began: number;
}

/** The pending pass of committed `encoders`: waiting reports on them and disposes them. */
function pendingPass(encoders: CommandEncoder[], summary: PassSummary): PendingPass {
  const committedAt = nowNs();
  const base = {
    mode: summary.mode,
    planCache: summary.planCache,
    fusions: summary.fusions,
    reordered: summary.reordered,
    barriers: summary.barriers,
    dispatches: encoders.reduce((n, e) => n + e.dispatchCount, 0),
    groups: encoders.reduce((n, e) => n + e.groupStats().groups, 0),
    encodingNs: committedAt - summary.began,
  };
  const report = (): FinishReport => ({
    ...base,
    gpuWaitNs: nowNs() - committedAt,
    gpuNs: encoders.reduce((n, e) => n + e.gpuNs, 0),
  });
  return {
    encoders,
    wait: () => {
      counterState.syncs++;
      try {
        for (const e of encoders) e.waitUntilCompleted();
        return report();
      } finally {
        for (const e of encoders) e.dispose();
      }
    },
    completed: async () => {
      try {
        for (const e of encoders) await e.completed();
        return report();
      } finally {
        for (const e of encoders) e.dispose();
      }
    },
  };
}

/** A template per command buffer's records; all or none (an MlxError when one is refused). */
function templatesOf(device: MlxDevice, records: readonly PlanRecords[]): CommandTemplate[] {
  const out: CommandTemplate[] = [];
  try {
    for (const r of records) out.push(new CommandTemplate(device, r));
  } catch (e) {
    for (const t of out) t.dispose();
    throw e;
  }
  return out;
}

/** What each frozen pass was frozen from: its capture's words (constants included) and key numbers. */
const frozenKeys = new WeakMap<FrozenPass, { readonly words: Uint32Array; readonly extra: Float64Array }>();

/** What a frozen pass replays. */
interface FrozenPlan {
  readonly validate: boolean;
  readonly label: string;
  /** Every buffer the pass binds (checked live at each commit). */
  readonly buffers: readonly MlxBuffer[];
  /** The captured nodes: the bindings of the plan's steps when its records cannot be used. */
  readonly nodes: readonly CapturedNode[];
  readonly plan: CachedPlan;
  /** The plan's records decoded once, per command buffer (null: they are encoded at each commit). */
  readonly templates: readonly CommandTemplate[] | null;
}

/**
 * A recorded pass optimised once ({@link GraphSession.freeze}) and committed any number of times:
 * each commit copies its command stream into new command buffers, with no capture, key comparison
 * or optimisation. Its buffers and constants are those of the frozen session; a buffer disposed
 * since is refused. Reports say `mode: "recorded"` and `planCache` "miss" for the first commit (the
 * freeze optimised it) and "hit" for every later one.
 */
export class FrozenPass {
  readonly #device: MlxDevice;
  #frozen: FrozenPlan | null;
  #commits = 0;
  #checkedAt = -1; // disposalCount() when its buffers were last found live

  /** @ignore Internal: made by GraphSession.freeze. */
  constructor(device: MlxDevice, frozen: FrozenPlan) {
    this.#device = device;
    this.#frozen = frozen;
  }

  /** Command buffers per commit (2 when frozen with `dualBuffer`; 0 once disposed). */
  get commandBuffers(): number {
    return this.#frozen?.plan.barriers.length ?? 0;
  }

  /** Commits the pass again without waiting. */
  commit(options: { label?: string | undefined } = {}): PendingPass {
    const began = nowNs();
    if (this.#frozen === null) {
      throw new MlxError("InvalidState", "FrozenPass.commit: this frozen pass was disposed; freeze a new one");
    }
    const { validate, buffers, nodes, plan } = this.#frozen;
    const label = options.label ?? this.#frozen.label;
    // The stream names its buffers by native handle: after any disposal, check that none of them
    // went (a freed handle's slot may be reused, and its generation tag can wrap).
    const disposals = disposalCount();
    if (disposals !== this.#checkedAt) {
      assertBuffersLive(buffers, "; freeze a new pass");
      this.#checkedAt = disposals;
    }
    const encoders: CommandEncoder[] = [];
    try {
      for (let c = 0; c < plan.barriers.length; c++) {
        encoders.push(this.#device.commandEncoder({ autoBarriers: false, validate }));
      }
      commitPlan(plan, encoders, () => nodes, validate, label, this.#frozen.templates);
    } catch (e) {
      for (const enc of encoders) enc.dispose();
      assertBuffersLive(buffers, "; freeze a new pass"); // the likely cause, said plainly
      throw e;
    }
    return pendingPass(encoders, {
      mode: "recorded",
      planCache: this.#commits++ === 0 ? "miss" : "hit",
      fusions: plan.fusions,
      reordered: plan.reordered,
      barriers: [...plan.barriers],
      began,
    });
  }

  /**
   * Drops the frozen command stream and its references to the pass's buffers (committed passes are
   * unaffected); later commits are refused.
   */
  dispose(): void {
    for (const t of this.#frozen?.templates ?? []) t.dispose();
    this.#frozen = null;
  }

  /** Same as {@link FrozenPass.dispose}. */
  [Symbol.dispose](): void {
    this.dispose();
  }
}
