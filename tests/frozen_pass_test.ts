/**
 * Frozen passes (GraphSession.freeze): a recorded pass optimised once and committed again and again
 * must do exactly what the same recorded pass, encoded and optimised afresh each time, does.
 */
import { deepStrictEqual, equal, throws } from "node:assert/strict";
import { DType, type FinishReport, GraphExecutor, type GraphSession, type MlxBuffer, MlxError } from "../mod.ts";
import { CommandEncoder } from "../src/encoder.ts";
import { reportWithoutTimes, testContext } from "./helpers.ts";

const N = 90, E = 64;
const stripTimes = reportWithoutTimes;

/**
 * N independent axpbys into slices, then N accumulations of them into `acc` slices, then a norm and
 * a multiply that the fusion pass merges: barriers, a fusion, and dispatches on both sides of the
 * dual-buffer split.
 */
function encodePass(s: GraphSession, b: Record<string, MlxBuffer>, slices: MlxBuffer[], accs: MlxBuffer[]): void {
  for (let i = 0; i < N; i++) s.axpby(b.x!, b.y!, slices[i]!, { alpha: 0.5 + i, beta: 1 });
  for (let i = 0; i < N; i++) s.elementwiseAdd(accs[i]!, slices[i]!, accs[i]!);
  s.rmsNorm(accs[0]!, b.w!, b.tmp!, { rows: 1, dim: E, eps: 1e-5 });
  s.elementwiseMul(b.tmp!, b.y!, b.out!);
}

Deno.test("a frozen pass committed k times equals k freshly optimised recorded passes", () => {
  using ctx = testContext();
  const { device } = ctx;
  const up = (v: number) => device.upload(new Float32Array(E).map((_, i) => v + i / E));
  const bufs: Record<string, MlxBuffer> = {
    x: up(1),
    y: up(-0.25),
    w: up(0.75),
    tmp: device.alloc(E * 4, DType.F32),
    out: device.alloc(E * 4, DType.F32),
  };
  using wide = device.alloc(N * E * 4, DType.F32), acc = device.alloc(N * E * 4, DType.F32);
  const slices = Array.from({ length: N }, (_, i) => wide.slice(i * E * 4, E * 4));
  const accs = Array.from({ length: N }, (_, i) => acc.slice(i * E * 4, E * 4));
  const state = () => [acc.readBytes(), bufs.out!.readBytes(), wide.readBytes()];
  for (const validate of [false, true]) {
    for (const dualBuffer of [false, true]) {
      const options = { fuse: true, reorder: true, dualBuffer };
      const fresh = new GraphExecutor(device, { planCache: false, validate });
      acc.write(new Float32Array(N * E));
      const expected: { report: ReturnType<typeof stripTimes>; bytes: Uint8Array[] }[] = [];
      for (let k = 0; k < 3; k++) {
        using s = fresh.beginRecorded();
        encodePass(s, bufs, slices, accs);
        expected.push({ report: stripTimes(s.finish(options)), bytes: state() });
      }
      acc.write(new Float32Array(N * E));
      const exec = new GraphExecutor(device, { validate });
      using s = exec.beginRecorded();
      encodePass(s, bufs, slices, accs);
      const frozen = s.freeze(options);
      equal(frozen.commandBuffers, dualBuffer ? 2 : 1);
      const outcomes: string[] = [];
      for (let k = 0; k < 3; k++) {
        // Without validation every command buffer copies the frozen records, decoded once at
        // freeze (no step is re-encoded, no record decoded again).
        const append = CommandEncoder.prototype.appendPlanRecords;
        const replay = CommandEncoder.prototype.appendTemplate;
        let appended = 0, replayed = 0;
        CommandEncoder.prototype.appendPlanRecords = function (...args) {
          const took = append.apply(this, args);
          if (took) appended++;
          return took;
        };
        CommandEncoder.prototype.appendTemplate = function (...args) {
          const took = replay.apply(this, args);
          if (took) replayed++;
          return took;
        };
        let report: FinishReport;
        try {
          report = frozen.commit().wait();
        } finally {
          CommandEncoder.prototype.appendPlanRecords = append;
          CommandEncoder.prototype.appendTemplate = replay;
        }
        equal(replayed, validate ? 0 : frozen.commandBuffers, "command buffers that replayed the decoded records");
        equal(appended, 0, "no command buffer decoded the records again");
        outcomes.push(report.planCache);
        const what = `validate ${validate}, dual ${dualBuffer}, commit ${k}`;
        deepStrictEqual({ report: stripTimes(report), bytes: state() }, expected[k], what);
      }
      deepStrictEqual(outcomes, ["miss", "hit", "hit"]);
      equal(expected[0]!.report.fusions, 1, "the pass has a fusion");
    }
  }
  // The accumulation really accumulates (the comparison above can fail): acc[0] = 3 · (0.5·x + y).
  const first = (acc.read() as Float32Array)[0]!;
  equal(Math.abs(first - 3 * (0.5 * 1 + -0.25)) < 1e-5, true, `acc[0] = ${first}`);
  for (const b of Object.values(bufs)) b.dispose();
});

Deno.test("freeze: only recorded sessions, once; a disposed buffer is refused and nothing runs", () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device);
  using a = device.upload(new Float32Array(8).fill(1)), out = device.alloc(32, DType.F32);
  using direct = exec.begin();
  direct.elementwiseAdd(a, a, out);
  throws(
    () => direct.freeze(),
    (e) => e instanceof MlxError && e.code === "InvalidState" && /beginRecorded/.test(e.message),
  );
  const victim = device.upload(new Float32Array(8).fill(2));
  using s = exec.beginRecorded();
  s.elementwiseAdd(a, victim, out);
  const frozen = s.freeze({ reorder: true });
  throws(() => s.freeze(), (e) => e instanceof MlxError && e.code === "InvalidState");
  throws(() => s.commit(), (e) => e instanceof MlxError && e.code === "InvalidState");
  out.write(new Float32Array(8));
  frozen.commit().wait();
  deepStrictEqual(Array.from(out.read() as Float32Array), new Array(8).fill(3));
  victim.dispose();
  out.write(new Float32Array(8));
  throws(
    () => frozen.commit(),
    (e) => e instanceof MlxError && e.code === "Disposed" && /freeze a new pass/.test(e.message),
  );
  deepStrictEqual(Array.from(out.read() as Float32Array), new Array(8).fill(0), "nothing ran");
});

Deno.test("isSamePass tells a frozen pass's exact repeat from a pass with other constants or ranges; dispose", () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device);
  using a = device.upload(new Float32Array(16).fill(1)), out = device.alloc(64, DType.F32);
  const pass = (alpha: number, half: number) => {
    const s = exec.beginRecorded();
    s.axpby(a.slice(0, 32), a.slice(32, 32), out.slice(half * 32, 32), { alpha, beta: 1 });
    return s;
  };
  const frozen = pass(2, 0).freeze({ reorder: true });
  equal(pass(2, 0).isSamePass(frozen), true, "the same pass");
  equal(pass(3, 0).isSamePass(frozen), false, "another constant");
  equal(pass(2, 1).isSamePass(frozen), false, "another output range");
  using direct = exec.begin();
  throws(() => direct.isSamePass(frozen), (e) => e instanceof MlxError && e.code === "InvalidState");
  frozen.commit().wait();
  deepStrictEqual(Array.from(out.read() as Float32Array).slice(0, 9), [3, 3, 3, 3, 3, 3, 3, 3, 0]);
  frozen.dispose();
  equal(frozen.commandBuffers, 0);
  throws(
    () => frozen.commit(),
    (e) => e instanceof MlxError && e.code === "InvalidState" && /disposed/.test(e.message),
  );
});
