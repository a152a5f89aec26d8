/**
 * Every kernel of the TypeScript contracts exists in every backend's sources: the CPU table (checked
 * through the library), the CUDA kernel tables and the MSL kernels (checked by reading the sources,
 * since those backends cannot run here).
 */
import { deepStrictEqual, ok } from "node:assert/strict";
import { allContracts } from "../src/kernels.ts";
import "../src/ops/mod.ts";
import { testContext } from "./helpers.ts";

const root = new URL("../", import.meta.url);
const read = (dir: string, ext: string) =>
  [...Deno.readDirSync(new URL(dir, root))].filter((e) => e.name.endsWith(ext))
    .map((e) => Deno.readTextFileSync(new URL(`${dir}${e.name}`, root))).join("\n");
const contractNames = () => allContracts().map((c) => c.name).sort();

Deno.test("the CPU backend implements every contract (with the contract's signature)", () => {
  using ctx = testContext({ backend: "cpu" });
  for (const name of contractNames()) ctx.registry.get(name); // throws KernelNotFound / AbiMismatch
});

Deno.test("the CUDA kernel tables name every contract, and nothing else", () => {
  const names = [...read("kernels/cuda/", ".cu").matchAll(/\{"(\w+)", \(const void \*\)/g)].map((m) => m[1]);
  deepStrictEqual([...new Set(names)].sort(), contractNames());
});

Deno.test("the MSL sources define every contract's kernel, and nothing else", () => {
  const src = read("kernels/metal/", ".metal");
  const direct = [...src.matchAll(/^kernel void (\w+)\(/gm)].map((m) => m[1]);
  // Kernels stamped out by a macro: NAME(kernel_name, …) at the start of a line.
  const stamped = [...src.matchAll(/^(?:BINARY|UNARY|SILU_MUL|DENSE|AFFINE|GGML|GGML_ID|SDPA|FLASH)\((\w+),/gm)].map((
    m,
  ) => m[1]);
  const norm = [...src.matchAll(/^RMS_NORM\((\w+),/gm)].flatMap((m) => [
    `rms_norm_${m[1]}`,
    `rms_norm_mul_${m[1]}`,
    `rms_norm_mul_add_${m[1]}`,
  ]);
  deepStrictEqual([...new Set([...direct, ...stamped, ...norm])].sort(), contractNames());
});

Deno.test("every CUDA kernel takes its arguments through kernel_args first (it waits for producers)", () => {
  const src = read("kernels/cuda/", ".cu");
  const kernels = [...src.matchAll(/__global__ void (\w+)\(const mlxn_gpu_args \*__restrict__ args\) \{\n(.*)\n/g)];
  deepStrictEqual(kernels.length, [...src.matchAll(/__global__/g)].length, "every kernel has the usual signature");
  for (const { 1: name, 2: first, index } of kernels) {
    if (first!.trim() === "const mlxn_gpu_args &a = kernel_args_early(args);") {
      // Work before the wait (a weight prefetch) is allowed; the kernel must still wait itself.
      const body = src.slice(index, src.indexOf("\n}\n", index));
      ok(body.includes("wait_producers();"), `${name} starts early but never calls wait_producers()`);
      continue;
    }
    deepStrictEqual(first!.trim(), "const mlxn_gpu_args &a = kernel_args(args);", name);
  }
});
