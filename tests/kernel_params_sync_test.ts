/**
 * The backends' bodies bind each parameter block as the struct generated from its description
 * (kernels/metal/_params.gen.metal, kernels/cuda/params.gen.cuh over native/contracts/contracts.gen.h),
 * at the slot the description gives it: a body whose slot or struct drifts from kernels/spec/kernels.ts
 * fails here. The families listed in SWITCHED bind every parameter block through a generated struct
 * (no hand-written struct, no raw offsets).
 */
import { deepStrictEqual, equal, ok } from "node:assert/strict";
import { families } from "../kernels/spec/kernels.ts";
import { assemble, preprocess, runtimeOrder } from "../metal_emu/msl_front.ts";

const root = new URL("../", import.meta.url);
const SWITCHED = ["matmul", "norm"];
const hasClang = (() => {
  try {
    return new Deno.Command("clang++", { args: ["--version"], stdout: "null", stderr: "null" }).outputSync().success;
  } catch {
    return false;
  }
})();

/** Each kernel's parameter-block slots: slot index → layout name. */
const layoutSlots = (family: string) =>
  new Map(
    families[family]!.map((k) => [
      k.name,
      new Map(k.slots.flatMap((s, i) => "params" in s ? [[i, s.params.name] as const] : [])),
    ]),
  );

/** The parameters of each `kernel void NAME(...)` of preprocessed MSL, split at top-level commas. */
export function kernelParams(text: string): Map<string, string[]> {
  const out = new Map<string, string[]>();
  for (const m of text.matchAll(/\bkernel\s+void\s+(\w+)\s*\(/g)) {
    let depth = 1, i = m.index! + m[0].length, cur = "";
    const params: string[] = [];
    for (; depth > 0 && i < text.length; i++) {
      const c = text[i]!;
      if (c === "(" || c === "[") depth++;
      if (c === ")" || c === "]") depth--;
      if (depth === 0) break;
      if (c === "," && depth === 1) {
        params.push(cur.trim());
        cur = "";
      } else cur += c;
    }
    params.push(cur.trim());
    out.set(m[1]!, params);
  }
  return out;
}

/** `constant T &name [[buffer(n)]]` parameters: slot n → T. */
export function constantBindings(params: readonly string[]): Map<number, string> {
  const out = new Map<number, string>();
  for (const p of params) {
    const m = /^constant\s+(\w+)\s*&\s*\w+\s*\[\[\s*buffer\((\d+)\)\s*\]\]$/.exec(p.replace(/\s+/g, " "));
    if (m) out.set(Number(m[2]), m[1]!);
  }
  return out;
}

Deno.test({
  name: "MSL bodies bind each parameter block as its generated struct, at the described slot",
  ignore: !hasClang,
}, async () => {
  const files = runtimeOrder(
    [...Deno.readDirSync(new URL("kernels/metal/", root))].map((e) => `kernels/metal/${e.name}`),
  );
  const pre = await preprocess(
    assemble(files.map((f) => ({ name: f, text: Deno.readTextFileSync(new URL(f, root)) }))),
  );
  ok(pre.ok, pre.stderr);
  const kernels = kernelParams(pre.text);
  let checked = 0;
  for (const family of Object.keys(families)) {
    for (const [name, slots] of layoutSlots(family)) {
      const params = kernels.get(name);
      ok(params, `no MSL kernel ${name}`);
      const bound = constantBindings(params);
      for (const [slot, type] of bound) {
        // Any generated struct must be the one described at that slot, in every family.
        if (type.startsWith("mlxn_params_")) {
          equal(type, `mlxn_params_${slots.get(slot)}`, `${name}: buffer(${slot}) binds ${type}`);
          checked++;
        }
      }
      if (SWITCHED.includes(family)) {
        deepStrictEqual(
          new Map([...bound].filter(([s]) => slots.has(s))),
          new Map([...slots].map(([s, l]) => [s, `mlxn_params_${l}`])),
          `${name}: every parameter block is bound as its generated struct`,
        );
      }
    }
  }
  ok(checked >= 42, `only ${checked} generated bindings seen`);
});

Deno.test("the parameter parser reads slots and struct names through attributes and nested brackets", () => {
  const k = kernelParams(
    "kernel void f(device const float *x [[buffer(0)]], constant mlxn_params_norm &p [[buffer(3)]], uint3 g [[thread_position_in_grid]]) {}",
  );
  deepStrictEqual(constantBindings(k.get("f")!), new Map([[3, "mlxn_params_norm"]]));
});

Deno.test("the CUDA and CPU matmul/norm bodies read no parameter word by raw offset", () => {
  for (const f of ["kernels/cuda/matmul.cu", "kernels/cuda/norm.cu", "kernels/cpu/matmul.c"]) {
    const text = Deno.readTextFileSync(new URL(f, root));
    deepStrictEqual(text.match(/\b(mlxn_)?arg_(u32|f32)\(/g) ?? [], [], `${f} reads a parameter by offset`);
  }
});
