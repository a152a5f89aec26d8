/**
 * Test helpers: the device under test (MLXN_BACKEND selects it; CPU by default), a seeded PRNG and
 * tolerance checks that report the worst element.
 */
import { type DType, type FinishReport, KernelRegistry, MlxDevice } from "../mod.ts";
import { roundThrough } from "../src/dtype.ts";

/** Opens the device under test. */
export function openDevice(options: Parameters<typeof MlxDevice.open>[0] = {}): MlxDevice {
  return MlxDevice.open(options);
}

/** A device and its registry, disposed together. */
export function testContext(options: Parameters<typeof MlxDevice.open>[0] = {}) {
  const device = openDevice(options);
  const registry = new KernelRegistry(device);
  return {
    device,
    registry,
    [Symbol.dispose]() {
      device.close();
    },
  };
}

/** mulberry32: a small deterministic PRNG. */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** n values uniform in [lo, hi), already representable in `dtype`. */
export function randomValues(n: number, seed: number, dtype: DType = "f32", lo = -2, hi = 2): Float32Array {
  const r = rng(seed);
  const v = new Float64Array(n);
  for (let i = 0; i < n; i++) v[i] = lo + (hi - lo) * r();
  return roundThrough(dtype, v);
}

/** Unit roundoff of a dtype's storage: half an ulp at 1.0. */
export function unitRoundoff(dtype: DType): number {
  return dtype === "f16" ? 2 ** -11 : dtype === "bf16" ? 2 ** -8 : 2 ** -24;
}

/**
 * Asserts |got[i] − want[i]| ≤ tol(i) for every i, and reports the worst violation with its index.
 */
export function assertClose(
  got: ArrayLike<number>,
  want: ArrayLike<number>,
  tol: (i: number) => number,
  what: string,
): void {
  if (got.length !== want.length) throw new Error(`${what}: length ${got.length} != ${want.length}`);
  let worst = -1, worstExcess = 0;
  for (let i = 0; i < got.length; i++) {
    const d = Math.abs(got[i]! - want[i]!);
    const excess = d - tol(i);
    if (!(excess <= 0) && (worst < 0 || excess > worstExcess || Number.isNaN(d))) {
      worst = i;
      worstExcess = excess;
    }
  }
  if (worst >= 0) {
    throw new Error(
      `${what}: element ${worst} got ${got[worst]}, want ${want[worst]} (|diff| ${
        Math.abs(got[worst]! - want[worst]!)
      } > tol ${tol(worst)})`,
    );
  }
}

/** Largest absolute difference. */
export function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
}

/**
 * Runs a Deno subprocess with exactly the given MLXN_* switches: inherited MLXN_* variables (say,
 * MLXN_LIB from a sanitizer run) are removed so each case controls its own configuration.
 */
export async function runDeno(
  args: string[],
  env: Record<string, string> = {},
): Promise<{ success: boolean; code: number; stdout: string; stderr: string }> {
  const inherited = Object.fromEntries(Object.entries(Deno.env.toObject()).filter(([k]) => !k.startsWith("MLXN_")));
  const out = await new Deno.Command(Deno.execPath(), {
    args,
    env: { ...inherited, ...env, NO_COLOR: "1" },
    clearEnv: true,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  return { success: out.success, code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

/** Whether `command --version` runs (a tool a test needs is installed). */
export function hasTool(command: string): boolean {
  try {
    return new Deno.Command(command, { args: ["--version"], stdout: "null", stderr: "null" }).outputSync().success;
  } catch {
    return false; // not installed
  }
}

/** The host's C compiler for tests that build a native program: clang, else cc. */
export function hostCompiler(): string {
  const cc = ["clang", "cc"].find(hasTool);
  if (cc === undefined) throw new Error("no C compiler (clang or cc) found");
  return cc;
}

/** A finish report without its times (which differ between runs): what two equal passes share. */
export function reportWithoutTimes(r: FinishReport) {
  return {
    mode: r.mode,
    fusions: r.fusions,
    reordered: r.reordered,
    barriers: r.barriers,
    dispatches: r.dispatches,
    groups: r.groups,
  };
}
