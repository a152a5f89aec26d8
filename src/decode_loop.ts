/**
 * A pipelined token loop: step n+1 is encoded and committed while step n runs on the device, the
 * host never reads logits inside the loop, and generated ids come back in batches.
 *
 * Each step's pass (encoded by a user callback) reads its input ids from one slot of a device ring
 * of u32 ids — with `ops.embedGather` — and ends with `ops.argmax` or `ops.sample` writing the
 * next ids into the following slot. The device runs command buffers in commit order, so activations
 * and caches shared by consecutive passes need no double buffering: only data the host writes while
 * passes are in flight would, and the loop's host writes nothing per step. By default slot choice,
 * position and KV length travel in each pass's own command stream as binding offsets and inline
 * constants. With `stepState`, they live in a small device buffer instead (the step state, layout in
 * src/ops/sample.ts): the loop writes it once per run and ends every pass with `stepAdvance`, so
 * consecutive passes encode identical command streams (a recorded pass then hits the plan cache).
 *
 * Ring safety: step k writes slot (k + 1) mod ring, so the ids of step k − ring + 1 must have been
 * read back by then. With at most `depth` passes in flight and at most `readBatch − 1` waited steps
 * unread, `ring ≥ depth + readBatch` guarantees it; the constructor checks that.
 *
 * @module
 */

import type { MlxBuffer } from "./buffer.ts";
import { sessionRepeats, StreamRepeats } from "./command_template.ts";
import { envConfig } from "./config.ts";
import { DType } from "./dtype.ts";
import { MlxError } from "./errors.ts";
import { STEP_STATE_WORDS } from "./ops/sample.ts";
import type {
  FinishOptions,
  FinishReport,
  FrozenPass,
  GraphExecutor,
  GraphSession,
  PendingPass,
  SessionOptions,
} from "./executor.ts";

/** Where one step reads its input ids and writes its output ids. */
export interface DecodeStep {
  /** Step number within this run, from 0. */
  readonly index: number;
  /** Position of the step's input token in the sequence: `startPosition + index`. */
  readonly position: number;
  /** Ring slot holding the step's input ids (`rows` u32): bind it as `ops.embedGather`'s `ids`. */
  readonly input: MlxBuffer;
  /** Ring slot the step's selection writes (`rows` u32): bind it as `ops.argmax` / `ops.sample` `ids`. */
  readonly output: MlxBuffer;
  /**
   * The step state's buffers, in a loop created with `stepState: true`: identical at every step (so
   * is the pass's command stream). Read the position on the device through them instead of using
   * `position`, `input` and `output`.
   */
  readonly state?: {
    /** Word 0 of the step state, the input token's position: the `state` of ropeNeox/ropeNorm, stridedCopy and flashAttnVec, and the `cursor` of `ops.embedGather`. */
    readonly position: MlxBuffer;
    /** Word 1 (position + 1): the `cursor` of `ops.argmax` / `ops.sample`, which adds it to the counter (pass `counter: 0xffffffff` for counter = position). */
    readonly next: MlxBuffer;
    /** The whole id ring: the `ids` of the gather and of the selection, with `ring: ringSlots`. */
    readonly ring: MlxBuffer;
    /** Slots of the ring. */
    readonly ringSlots: number;
  } | undefined;
}

type StepStateViews = NonNullable<DecodeStep["state"]>;

/**
 * Encodes one token's pass into `session`: read the input ids from `step.input`, run the model at
 * `step.position`, and write the chosen ids into `step.output`. Must not wait for the device or read
 * device memory (that would serialise the pipeline). For seeded sampling pass `counter:
 * step.position`, so a seed gives the same tokens however a generation is split into runs.
 */
export type EncodeStep = (session: GraphSession, step: DecodeStep) => void;

/** Options of a {@link DecodeLoop}. */
export interface DecodeLoopOptions {
  /** Encodes one step's pass. */
  encodeStep: EncodeStep;
  /** Sequences decoded side by side: ids per slot (default 1). */
  rows?: number | undefined;
  /** Passes committed and not yet waited for (default 2; 1 = unpipelined: wait for each pass). */
  depth?: number | undefined;
  /** Read generated ids back every this many steps (default 16), and at the end of a run. */
  readBatch?: number | undefined;
  /** Slots of the id ring (default `depth + readBatch`, its minimum). */
  ring?: number | undefined;
  /** Record each pass (`beginRecorded`) so `finish` options can optimise it (default false: direct). */
  recorded?: boolean | undefined;
  /**
   * Drive each pass from a device step state (default false): the loop allocates it, writes the start
   * position once per run, passes its views as `DecodeStep.state` and appends `stepAdvance` (after a
   * barrier) to every pass. Step k then uses ring slots (startPosition + k) mod ring and + 1.
   */
  stepState?: boolean | undefined;
  /**
   * Encode each run's first step only and commit that pass, frozen ({@link GraphSession.freeze}),
   * for every later step: no per-step encoding (default false). Needs `recorded` and `stepState`,
   * and a pass that reads every per-step value through `step.state`. `encodeStep` is then called
   * twice per run of two steps or more: the second call encodes the next step's pass, never
   * committed, to check that it is the same (an InvalidArgument when it is not).
   */
  frozen?: boolean | undefined;
  /** Options of every step's session (e.g. autoBarriers). */
  session?: SessionOptions | undefined;
  /** Commit options of every pass (fuse, reorder, dualBuffer); the label defaults to `token <position>`. */
  finish?: FinishOptions | undefined;
}

// Each ring slot is a JS view: bound the ring so a huge depth or readBatch is an error, not gigabytes.
const MAX_RING_SLOTS = 1 << 16;

/** Arguments of {@link DecodeLoop.run}. */
export interface DecodeRunOptions {
  /** Input ids of step 0, one per row (written to the ring before the first pass). */
  first: number | ArrayLike<number>;
  /** Steps to run (each generates one id per row). */
  steps: number;
  /** Position of step 0's input token (default 0). */
  startPosition?: number | undefined;
  /** Called with each batch of generated ids as it is read back (`rows` ids per step, step-major). */
  onTokens?: ((ids: Uint32Array, firstStep: number) => void) | undefined;
}

/** Host-clock times (ns, `performance.now()` scale) of one step. */
export interface StepTiming {
  /** Step number within the run. */
  readonly index: number;
  /** The session began (encoding starts). */
  readonly encodeStartNs: number;
  /** Commit of its command buffers returned (the device may have started before). */
  readonly committedNs: number;
  /** The host began waiting for the pass. */
  readonly waitStartNs: number;
  /** The wait returned. */
  readonly waitEndNs: number;
  /** Device clock (ns) start and end of each command buffer of the pass. */
  readonly deviceSpans: readonly (readonly [startNs: number, endNs: number])[];
}

/** Host-clock times of one batched read of generated ids. */
export interface ReadbackTiming {
  /** First step whose ids were read. */
  readonly firstStep: number;
  /** Steps read. */
  readonly steps: number;
  /** Read began, ns. */
  readonly startNs: number;
  /** Read ended, ns. */
  readonly endNs: number;
}

/** What a run produced and how long it took. */
export interface DecodeRunReport {
  /** Generated ids, `rows` per step, step-major: step k's ids are `tokens[k·rows, (k+1)·rows)`. */
  readonly tokens: Uint32Array;
  /** Host wall time of the run, ns (first encode to last id read). */
  readonly wallNs: number;
  /** Device execution time summed over every command buffer, ns. */
  readonly deviceNs: number;
  /** Host time spent encoding and committing passes, ns. */
  readonly encodeNs: number;
  /** Batched reads of generated ids (the loop's only device-to-host copies). */
  readonly readbacks: readonly ReadbackTiming[];
  /** Per-step host and device times (for traces). */
  readonly timings: readonly StepTiming[];
  /** Each pass's finish report, in step order. */
  readonly reports: readonly FinishReport[];
}

const nowNs = () => performance.now() * 1e6;

function positiveInt(name: string, v: number, hint: string): number {
  if (!Number.isSafeInteger(v) || v < 1 || v > 0xffffffff) {
    throw new MlxError("InvalidArgument", `DecodeLoop: ${name} must be an integer in [1, 2^32), got ${v}; ${hint}`);
  }
  return v;
}

interface InFlight {
  index: number;
  encodeStartNs: number;
  committedNs: number;
  pass: PendingPass;
}

/**
 * Runs a token loop with up to `depth` passes in flight and no host read of logits: the device's
 * own selection feeds the next pass through a ring of ids, read back every `readBatch` steps.
 *
 * @example
 * ```ts ignore
 * import { DecodeLoop, GraphExecutor, MlxDevice, ops } from "@mlxn/mlx-native";
 * using device = MlxDevice.open();
 * const exec = new GraphExecutor(device);
 * // table [vocab, dim] f32 on the device; model(s, x, position) writes logits [vocab].
 * using loop = new DecodeLoop(exec, {
 *   encodeStep(s, step) {
 *     ops.embedGather(s, exec.registry, table, step.input, x, { dim, vocab });
 *     s.barrier();
 *     model(s, x, step.position);
 *     s.barrier();
 *     ops.sample(s, exec.registry, logits, step.output, { vocab, temperature: 0.8, seed: 7, counter: step.position });
 *   },
 * });
 * const { tokens } = loop.run({ first: bosId, steps: 128, onTokens: (ids) => print(ids) });
 * ```
 */
export class DecodeLoop {
  /** The executor every pass runs on. */
  readonly executor: GraphExecutor;
  /** Ids per slot. */
  readonly rows: number;
  /** Passes in flight at most. */
  readonly depth: number;
  /** Steps per batched read of ids. */
  readonly readBatch: number;
  /** Slots of the id ring. */
  readonly ringSlots: number;
  /** The device ring of ids: `ringSlots` slots of `rows` u32. */
  readonly ids: MlxBuffer;
  readonly #encodeStep: EncodeStep;
  readonly #recorded: boolean;
  readonly #frozen: boolean;
  readonly #session: SessionOptions;
  readonly #finish: FinishOptions;
  readonly #slots: MlxBuffer[];
  /** The step state (u32 × STEP_STATE_WORDS) and its views, with `stepState`. */
  readonly #state: { buffer: MlxBuffer; views: StepStateViews } | undefined;
  #running = false;

  /** A loop on `executor`'s device; allocates the id ring. */
  constructor(executor: GraphExecutor, options: DecodeLoopOptions) {
    if (typeof options?.encodeStep !== "function") {
      throw new MlxError("InvalidArgument", "DecodeLoop: pass encodeStep, the function that encodes one step's pass");
    }
    this.executor = executor;
    this.rows = positiveInt("rows", options.rows ?? 1, "it is the number of sequences decoded side by side");
    this.depth = positiveInt("depth", options.depth ?? 2, "use 1 for an unpipelined loop, 2 to overlap");
    this.readBatch = positiveInt("readBatch", options.readBatch ?? 16, "it is how many steps one read covers");
    const minRing = this.depth + this.readBatch;
    this.ringSlots = positiveInt("ring", options.ring ?? minRing, "it is the number of id slots");
    if (this.ringSlots < minRing) {
      throw new MlxError(
        "InvalidArgument",
        `DecodeLoop: ring ${this.ringSlots} is too small for depth ${this.depth} and readBatch ` +
          `${this.readBatch}: unread ids would be overwritten; use ring >= ${minRing} (depth + readBatch)`,
      );
    }
    if (this.ringSlots > MAX_RING_SLOTS) {
      throw new MlxError(
        "InvalidArgument",
        `DecodeLoop: ring ${this.ringSlots} (depth ${this.depth} + readBatch ${this.readBatch} at least) exceeds ` +
          `${MAX_RING_SLOTS} slots: lower depth, readBatch or ring (a few steps in flight and a read every few ` +
          `dozen steps keep the device busy)`,
      );
    }
    const slotBytes = this.rows * 4;
    const bytes = this.ringSlots * slotBytes;
    if (!Number.isSafeInteger(bytes) || this.ringSlots * this.rows > 0xffffffff) {
      throw new MlxError("InvalidArgument", `DecodeLoop: ring × rows = ${this.ringSlots * this.rows} ids is too large`);
    }
    this.#encodeStep = options.encodeStep;
    this.#recorded = options.recorded ?? false;
    this.#frozen = options.frozen ?? false;
    if (this.#frozen && !(this.#recorded && options.stepState)) {
      throw new MlxError(
        "InvalidArgument",
        "DecodeLoop: frozen needs recorded: true and stepState: true (only a state-driven recorded pass is the " +
          "same at every step)",
      );
    }
    this.#session = { ...options.session };
    this.#finish = { ...options.finish };
    this.ids = executor.device.alloc(bytes, DType.U32, [this.ringSlots, this.rows]);
    this.#slots = Array.from({ length: this.ringSlots }, (_, s) => this.ids.slice(s * slotBytes, slotBytes));
    if (options.stepState) {
      const buffer = executor.device.alloc(STEP_STATE_WORDS * 4, DType.U32, [STEP_STATE_WORDS]);
      const views = {
        position: buffer.slice(0, 4),
        next: buffer.slice(4, 4),
        ring: this.ids,
        ringSlots: this.ringSlots,
      };
      this.#state = { buffer, views };
    }
  }

  /** The step state buffer (u32 × STEP_STATE_WORDS), when the loop was created with `stepState`. */
  get stepState(): MlxBuffer | undefined {
    return this.#state?.buffer;
  }

  /**
   * Runs `steps` steps from `first` and returns the generated ids. Blocks the calling thread while
   * it waits for passes (see {@link DecodeLoop.runAsync} to keep the event loop free). A failing
   * pass (e.g. an id ≥ vocab in the gather) throws its CommandBufferError after every pass still
   * in flight has been waited for.
   */
  run(options: DecodeRunOptions): DecodeRunReport {
    const loop = this.#start(options);
    let next = loop.next();
    while (!next.done) {
      let report: FinishReport;
      try {
        report = next.value.wait();
      } catch (e) {
        next = loop.throw(e);
        continue;
      }
      next = loop.next(report);
    }
    return next.value;
  }

  /** {@link DecodeLoop.run} that awaits each pass instead of blocking the thread. */
  async runAsync(options: DecodeRunOptions): Promise<DecodeRunReport> {
    const loop = this.#start(options);
    let next = loop.next();
    while (!next.done) {
      let report: FinishReport;
      try {
        report = await next.value.completed();
      } catch (e) {
        next = loop.throw(e);
        continue;
      }
      next = loop.next(report);
    }
    return next.value;
  }

  /** Checks a run's arguments and returns its loop (checking before the generator starts). */
  #start(options: DecodeRunOptions): Generator<PendingPass, DecodeRunReport, FinishReport> {
    if (this.#running) {
      throw new MlxError("InvalidState", "DecodeLoop.run: a run is in progress (called from encodeStep or onTokens?)");
    }
    if (this.ids.disposed) {
      throw new MlxError("Disposed", "DecodeLoop.run: this loop was disposed; create a new DecodeLoop");
    }
    const steps = options.steps;
    if (!Number.isSafeInteger(steps) || steps < 0) {
      throw new MlxError("InvalidArgument", `DecodeLoop.run: steps must be a non-negative integer, got ${steps}`);
    }
    const start = options.startPosition ?? 0;
    if (!Number.isSafeInteger(start) || start < 0 || start + steps > 0xffffffff) {
      throw new MlxError(
        "InvalidArgument",
        `DecodeLoop.run: startPosition must be an integer >= 0 with startPosition + steps < 2^32, got ${start}`,
      );
    }
    const first = typeof options.first === "number" ? [options.first] : Array.from(options.first);
    if (first.length !== this.rows || !first.every((v) => Number.isInteger(v) && v >= 0 && v <= 0xffffffff)) {
      throw new MlxError(
        "InvalidArgument",
        `DecodeLoop.run: first must be ${this.rows} u32 token id(s) (one per row), got [${first.join(", ")}]`,
      );
    }
    this.#running = true;
    return this.#loop(first, steps, start, options.onTokens);
  }

  /**
   * The loop itself, driven by run / runAsync: it yields each pass it needs waited for and
   * receives the pass's report (or its error, thrown in).
   */
  *#loop(
    first: number[],
    steps: number,
    start: number,
    onTokens: DecodeRunOptions["onTokens"],
  ): Generator<PendingPass, DecodeRunReport, FinishReport> {
    const rows = this.rows, R = this.ringSlots, state = this.#state;
    // Ring slot of step k's input: k mod R, or (start + k) mod R when the state's position picks it.
    const base = state ? start % R : 0;
    const tokens = new Uint32Array(steps * rows);
    const timings: StepTiming[] = [], reports: FinishReport[] = [], readbacks: ReadbackTiming[] = [];
    const inFlight: InFlight[] = [];
    let waited = 0, read = 0, deviceNs = 0, encodeNs = 0;
    let waiting: InFlight | undefined; // the pass whose wait is under way
    let frozen: FrozenPass | undefined; // this run's first pass, with `frozen`
    // Every pass's commit options: one object per run (commit reads them and keeps nothing), the
    // label set per step.
    const commitOptions: FinishOptions = { ...this.#finish };
    // Direct passes of a state-driven loop repeat byte for byte: from the second on they replay a
    // template of the first instead of being decoded (kept for this run only).
    const direct = { ...this.#session };
    const repeats = this.#recorded || !envConfig().planCache ? null : new StreamRepeats(this.executor.device);
    if (repeats !== null) sessionRepeats.set(direct, repeats);
    const fixedLabel = this.#finish.label;
    const t0 = nowNs();

    const readBack = () => {
      const t = nowNs(), from = read;
      // Step j's ids are in slot (j + 1) mod R: at most two contiguous pieces of the ring.
      while (read < waited) {
        const slot = (base + read + 1) % R, n = Math.min(waited - read, R - slot);
        const ids = this.ids.slice(slot * rows * 4, n * rows * 4).read() as Uint32Array;
        tokens.set(ids, read * rows);
        read += n;
      }
      readbacks.push({ firstStep: from, steps: read - from, startNs: t, endNs: nowNs() });
      onTokens?.(tokens.subarray(from * rows, read * rows), from);
    };
    const completed = (f: InFlight, waitStartNs: number, report: FinishReport) => {
      timings.push({
        index: f.index,
        encodeStartNs: f.encodeStartNs,
        committedNs: f.committedNs,
        waitStartNs,
        waitEndNs: nowNs(),
        deviceSpans: f.pass.encoders.map((e) => [e.gpuStartNs, e.gpuEndNs] as const),
      });
      reports.push(report);
      deviceNs += report.gpuNs;
      waited++;
    };

    try {
      this.#slots[base]!.write(new Uint32Array(first));
      // No pass is in flight between runs: the state is written before the first pass only.
      state?.buffer.write(Uint32Array.from([start, start + 1, 0, 0]));
      for (let k = 0; k <= steps; k++) {
        if (k < steps) {
          const encodeStartNs = nowNs();
          const label = commitOptions.label = fixedLabel ?? `token ${start + k}`;
          let pass: PendingPass;
          if (frozen !== undefined) pass = frozen.commit({ label });
          else {
            const s = this.#recorded ? this.executor.beginRecorded(this.#session) : this.executor.begin(direct);
            try {
              this.#encodePass(s, k, start, base);
              if (this.#frozen) {
                frozen = s.freeze(this.#finish);
                // One frozen pass replays every step: check that the next step's pass is the same.
                if (steps - k > 1 && !this.#nextStepIsSame(frozen, k + 1, start, base)) {
                  throw new MlxError(
                    "InvalidArgument",
                    `DecodeLoop: frozen: the passes of steps ${k} and ${k + 1} differ, so one frozen pass cannot ` +
                      `replay every step; read the position and the id ring through step.state (not step.input, ` +
                      `step.output or per-step inline constants), or create the loop without frozen`,
                  );
                }
                pass = frozen.commit({ label });
              } else pass = s.commit(commitOptions);
            } finally {
              s.dispose(); // no-op once committed or frozen
            }
          }
          const committedNs = nowNs();
          encodeNs += committedNs - encodeStartNs;
          inFlight.push({ index: k, encodeStartNs, committedNs, pass });
        }
        // After the last step, drain: every pass is waited for and every id read.
        while (inFlight.length >= (k < steps ? this.depth : 1)) {
          const f = inFlight[0]!, waitStartNs = nowNs();
          waiting = f;
          const report = yield f.pass;
          waiting = undefined;
          inFlight.shift();
          completed(f, waitStartNs, report);
        }
        if (waited - read >= this.readBatch || (k === steps && waited > read)) readBack();
      }
    } catch (e) {
      // Wait for every pass still in flight (but the one whose wait threw), then report the error.
      for (const f of inFlight.splice(0)) {
        if (f === waiting) continue;
        try {
          yield f.pass;
        } catch { /* the first failure is the one reported */ }
      }
      throw e;
    } finally {
      frozen?.dispose(); // its decoded records reference the pass's buffers; the passes it committed stay
      repeats?.clear();
      this.#running = false;
    }
    return { tokens, wallNs: nowNs() - t0, deviceNs, encodeNs, readbacks, timings, reports };
  }

  /** Encodes step `k`'s pass (the user's step, then the step state's advance) into `s`. */
  #encodePass(s: GraphSession, k: number, start: number, base: number): void {
    const R = this.ringSlots, state = this.#state;
    this.#encodeStep(s, {
      index: k,
      position: start + k,
      input: this.#slots[(base + k) % R]!,
      output: this.#slots[(base + k + 1) % R]!,
      state: state?.views,
    });
    if (state) {
      s.barrier(); // every read of the state in this pass precedes its advance
      s.stepAdvance(state.buffer);
    }
  }

  /** Whether step `k`'s pass, encoded into a recorded session that is never committed, is `frozen`'s. */
  #nextStepIsSame(frozen: FrozenPass, k: number, start: number, base: number): boolean {
    const s = this.executor.beginRecorded(this.#session);
    try {
      this.#encodePass(s, k, start, base);
      return s.isSamePass(frozen);
    } finally {
      s.dispose();
    }
  }

  /** Frees the id ring (slot views share its allocation) and the step state. */
  dispose(): void {
    this.ids.dispose();
    this.#state?.buffer.dispose();
  }

  /** Same as {@link DecodeLoop.dispose}. */
  [Symbol.dispose](): void {
    this.dispose();
  }
}
