/**
 * The element-wise session ops after their hot path was made small enough for V8 to inline: the
 * element count each float type defaults to, and every refusal (its code, its message and that
 * nothing was encoded), through the session methods and through `ops.*` on an encoder.
 */
import { deepStrictEqual, equal, throws } from "node:assert/strict";
import { DType, GraphExecutor, MlxError, ops } from "../mod.ts";
import { openDevice } from "./helpers.ts";

const FLOATS = [DType.F32, DType.F16, DType.BF16] as const;

/** Small integers: exact in every float type, and so are their sums and products. */
function ints(n: number, seed: number): Float32Array {
  return Float32Array.from({ length: n }, (_, i) => ((i * 7 + seed) % 13) - 6);
}

function refusal(code: string, message: string): (e: unknown) => boolean {
  return (e) => {
    if (!(e instanceof MlxError)) return false;
    equal(e.code, code);
    equal(e.message, message);
    return true;
  };
}

Deno.test("binary ops default to the output's element count in every float type", () => {
  using device = openDevice();
  const exec = new GraphExecutor(device);
  for (const dt of FLOATS) {
    const av = ints(37, 1), bv = ints(37, 5);
    using a = device.upload(av, dt), b = device.upload(bv, dt);
    using sum = device.alloc(20 * (dt === DType.F32 ? 4 : 2), dt);
    using prod = device.alloc(20 * (dt === DType.F32 ? 4 : 2), dt);
    using wide = device.alloc(37 * (dt === DType.F32 ? 4 : 2), dt);
    const s = exec.begin({ autoBarriers: true });
    s.elementwiseAdd(a, b, sum); // 20 elements: the output's length
    s.elementwiseMul(a, b, prod);
    s.elementwiseAdd(a, b, wide, 11); // an explicit count leaves the rest untouched
    s.finish();
    deepStrictEqual(Array.from(sum.read()), Array.from({ length: 20 }, (_, i) => av[i]! + bv[i]!), dt);
    deepStrictEqual(Array.from(prod.read()), Array.from({ length: 20 }, (_, i) => av[i]! * bv[i]!), dt);
    deepStrictEqual(
      Array.from(wide.read()),
      Array.from({ length: 37 }, (_, i) => (i < 11 ? av[i]! + bv[i]! : 0)),
      dt,
    );
  }
});

Deno.test("unary ops default to the output's element count in every float type", () => {
  using device = openDevice();
  const exec = new GraphExecutor(device);
  for (const dt of FLOATS) {
    using input = device.upload(new Float32Array(24).fill(0), dt); // silu(0) = gelu(0) = 0
    using output = device.upload(new Float32Array(24).fill(5), dt);
    using half = output.slice(0, 12 * (dt === DType.F32 ? 4 : 2));
    const s = exec.begin();
    s.silu(input, half); // 12 elements; the other 12 keep their 5
    s.finish();
    deepStrictEqual(Array.from(output.read()), Array.from({ length: 24 }, (_, i) => (i < 12 ? 0 : 5)), dt);
  }
});

Deno.test("binary op refusals: code, message, and nothing encoded", () => {
  using device = openDevice();
  const exec = new GraphExecutor(device);
  using a = device.upload(ints(16, 1)), b = device.upload(ints(16, 2)), out = device.alloc(64, DType.F32);
  using bHalf = device.upload(ints(16, 2), DType.BF16), outHalf = device.alloc(8, DType.BF16);
  using u = device.upload(new Uint32Array(16)), uOut = device.alloc(64, DType.U32);
  const s = exec.begin();
  try {
    const cases: [() => void, string][] = [
      [() => s.elementwiseAdd(u, u, uOut), "elementwise_add: dtype u32 is not supported (use f32, f16, bf16)"],
      [() => s.elementwiseMul(a, bHalf, out), "elementwise_mul: b must be f32, got bf16"],
      [() => s.elementwiseAdd(a, b, out, 0), "elementwise_add: n must be an integer >= 1, got 0"],
      [() => s.elementwiseAdd(a, b, out, 2.5), "elementwise_add: n must be an integer >= 1, got 2.5"],
      [() => s.elementwiseAdd(a, b, out, 17), "elementwise_add: a holds 64 bytes, needs 68 (17 × f32)"],
      [() => s.siluMul(a, b, out.slice(0, 32), 9), "silu_mul: out holds 32 bytes, needs 36 (9 × f32)"],
      // The default count comes from the output's own type: 4 bf16 elements, then its type is refused.
      [() => s.elementwiseAdd(a, b, outHalf), "elementwise_add: out must be f32, got bf16"],
    ];
    for (const [call, message] of cases) {
      throws(call, refusal("InvalidArgument", message));
      equal(s.encoder.dispatchCount, 0);
    }
    using enc = device.commandEncoder();
    throws(
      () => ops.elementwiseAdd(enc, device.kernels, a, bHalf, out),
      refusal("InvalidArgument", "elementwise_add: b must be f32, got bf16"),
    );
    equal(enc.dispatchCount, 0);
  } finally {
    s.dispose();
  }
});

Deno.test("unary op refusals: code, message, and nothing encoded", () => {
  using device = openDevice();
  const exec = new GraphExecutor(device);
  using input = device.upload(ints(16, 1)), output = device.alloc(64, DType.F32);
  using outHalf = device.alloc(32, DType.F16), u = device.alloc(64, DType.U32);
  const s = exec.begin();
  try {
    const cases: [() => void, string][] = [
      [() => s.gelu(u, u), "gelu: dtype u32 is not supported (use f32, f16, bf16)"],
      [() => s.gelu(input, outHalf), "gelu: output must be f32, got f16"],
      [() => s.silu(input, output, 0), "silu: n must be an integer >= 1, got 0"],
      [() => s.silu(input.slice(0, 16), output), "silu: input holds 16 bytes, needs 64 (16 × f32)"],
      [() => s.silu(input, output.slice(0, 8), 3), "silu: output holds 8 bytes, needs 12 (3 × f32)"],
    ];
    for (const [call, message] of cases) {
      throws(call, refusal("InvalidArgument", message));
      equal(s.encoder.dispatchCount, 0);
    }
  } finally {
    s.dispose();
  }
});
