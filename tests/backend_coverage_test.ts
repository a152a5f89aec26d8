/**
 * The kernel tables derive from the descriptions (kernels/spec/kernels.ts, scripts/gen_kernels.ts):
 * the generated files are fresh, the CPU library implements every contract with its signature, and
 * every CUDA kernel takes its arguments the usual way. (A CUDA or CPU body missing for a described
 * kernel fails the link; tests/metal_check_test.ts checks the MSL kernels are exactly the contracts.)
 */
import { deepStrictEqual, equal, ok } from "node:assert/strict";
import { allContracts, contractSignature } from "../src/kernels.ts";
import "../src/ops/mod.ts";
import { families } from "../kernels/spec/kernels.ts";
import { generate } from "../scripts/gen_kernels.ts";
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

Deno.test("the generated kernel tables are fresh (make gen): each equals what the descriptions generate", async () => {
  for (const [path, text] of await generate()) {
    equal(Deno.readTextFileSync(new URL(path, root)), text, `${path} is stale: run \`make gen\``);
  }
});

Deno.test("the generated contracts are the descriptions: every described kernel, its slots and its rule", () => {
  const described = Object.values(families).flat();
  deepStrictEqual(contractNames(), described.map((k) => k.name).sort());
  for (const k of described) {
    const c = allContracts().find((x) => x.name === k.name)!;
    equal(contractSignature(c), k.slots.map((s) => "params" in s ? "c" : s.optional ? "o" : "b").join(""), k.name);
    equal(c.tgFloatsPerThread, k.tgFloatsPerThread, k.name);
  }
});

Deno.test("every CUDA kernel takes its arguments through kernel_args first (it waits for producers)", () => {
  const src = read("kernels/cuda/", ".cu");
  const kernels = [...src.matchAll(/__global__ void (\w+)\(const mlxn_gpu_args \*__restrict__ args\) \{\n(.*)\n/g)];
  deepStrictEqual(kernels.length, [...src.matchAll(/__global__/g)].length, "every kernel has the usual signature");
  for (const { 1: name, 2: first = "", index } of kernels) {
    if (first.trim() === "const mlxn_gpu_args &a = kernel_args_early(args);") {
      // Work before the wait (a weight prefetch) is allowed; the kernel must still wait itself.
      const body = src.slice(index, src.indexOf("\n}\n", index));
      ok(body.includes("wait_producers();"), `${name} starts early but never calls wait_producers()`);
      continue;
    }
    deepStrictEqual(first!.trim(), "const mlxn_gpu_args &a = kernel_args(args);", name);
  }
});

Deno.test("the core, the contracts and the GPU backends include nothing of kernels/cpu", () => {
  const dirs = ["native/core/", "native/contracts/", "native/cuda/", "objc/", "kernels/cuda/"];
  for (const dir of dirs) {
    for (const e of Deno.readDirSync(new URL(dir, root))) {
      if (!e.isFile) continue;
      const text = Deno.readTextFileSync(new URL(`${dir}${e.name}`, root));
      ok(!/#include\s+"[^"]*kernels\/cpu\//.test(text), `${dir}${e.name} includes a CPU kernel header`);
    }
  }
});
