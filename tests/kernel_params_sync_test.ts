/**
 * The backends' bodies bind each parameter block as the struct generated from its description
 * (kernels/metal/_params.gen.metal, kernels/cuda/params.gen.cuh over native/contracts/contracts.gen.h),
 * at the slot the description gives it: a body whose slot or struct drifts from kernels/spec/kernels.ts
 * fails here. Every family binds every parameter block through a generated struct, and no validator
 * or body reads a parameter word by its offset or declares its own parameter struct.
 */
import { deepStrictEqual, equal, ok } from "node:assert/strict";
import { families } from "../kernels/spec/kernels.ts";
import { assemble, preprocess, runtimeOrder } from "../metal_emu/msl_front.ts";

const root = new URL("../", import.meta.url);
/** Every family: each binds all its parameter blocks through the generated structs. */
const SWITCHED = Object.keys(families);
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

/** The hand-written validators and bodies: every non-generated source file of these folders. */
const SOURCE_DIRS = ["native/contracts/", "kernels/cpu/", "kernels/cuda/", "kernels/metal/"];
const SOURCE_EXT = /\.(c|h|cu|cuh|metal)$/;

/** Each field's byte-offset macro name, MLXN_PARAMS_<LAYOUT>_<FIELD> (not generated: nothing may read a field by offset). */
const fieldOffsetMacros = new Set(
  Object.values(families).flat().flatMap((k) =>
    k.slots.flatMap((s) =>
      "params" in s ? s.params.fields.map(([f]) => `MLXN_PARAMS_${s.params.name}_${f}`.toUpperCase()) : []
    )
  ),
);

/**
 * The places in `text` (C, CUDA or MSL) that read a parameter block other than whole, as its generated
 * struct: a word read at an offset (`mlxn_arg_u32(a, 2, 36)`, `arg_f32(a, 4, 20)`), a field's offset
 * macro, the CUDA argument block's inline bytes, an MSL block bound as words (`constant uint *p`), or a
 * hand-written parameter struct.
 */
export function rawParamReads(text: string): string[] {
  const found: string[] = [];
  const code = text.replace(/\/\*[\s\S]*?\*\/|\/\/[^\n]*/g, ""); // comments may name the old forms
  for (const re of [/\b(?:mlxn_)?arg_(?:u32|f32)\s*\(/g, /\.bytes\s*\+/g, /\.boff\s*\[/g]) {
    for (const m of code.matchAll(re)) found.push(m[0]);
  }
  for (const m of code.matchAll(/\bMLXN_PARAMS_[A-Z0-9_]+\b/g)) if (fieldOffsetMacros.has(m[0])) found.push(m[0]);
  for (const m of code.matchAll(/\bconstant\s+(?:uint|int|float)\s*\*\s*\w+\s*\[\[\s*buffer\(/g)) found.push(m[0]);
  for (const m of code.matchAll(/\bstruct\s+(\w*params\w*)\s*\{/g)) found.push(m[0]);
  return found;
}

Deno.test("no validator or body reads a parameter block by offset or through its own struct", () => {
  let files = 0;
  for (const dir of SOURCE_DIRS) {
    for (const e of Deno.readDirSync(new URL(dir, root))) {
      if (!e.isFile || !SOURCE_EXT.test(e.name) || e.name.includes(".gen.")) continue;
      files++;
      const f = dir + e.name;
      deepStrictEqual(rawParamReads(Deno.readTextFileSync(new URL(f, root))), [], `${f} reads a parameter block raw`);
    }
  }
  ok(files >= 25, `only ${files} source files scanned`);
});

/** Each generated slot macro of a parameter block (MLXN_SLOT_<KERNEL>_<LAYOUT>) → its layout's name. */
const paramSlotMacros = new Map(
  Object.values(families).flat().flatMap((k) =>
    k.slots.flatMap((s) => "params" in s ? [[`MLXN_SLOT_${k.name}_${s.params.name}`.toUpperCase(), s.params.name]] : [])
  ),
);

/**
 * The C/CUDA reads `mlxn_params_<layout>_of(a, SLOT)` / `_at(a, SLOT)` whose SLOT is a generated slot
 * macro (directly, or through a `#define NAME MLXN_SLOT_…` of the file), as [layout read, layout of
 * that slot (undefined: no such parameter slot)].
 */
export function structReads(text: string): [read: string, slot: string, described: string | undefined][] {
  const alias = new Map([...text.matchAll(/#define\s+(\w+)\s+(MLXN_SLOT_\w+)\s*$/gm)].map((m) => [m[1]!, m[2]!]));
  const out: [string, string, string | undefined][] = [];
  for (const m of text.matchAll(/\bmlxn_params_(\w+)_(?:at|of)\s*\(\s*a\s*,\s*(\w+)\s*\)/g)) {
    const slot = m[2]!.startsWith("MLXN_SLOT_") ? m[2]! : alias.get(m[2]!);
    if (slot) out.push([m[1]!, slot, paramSlotMacros.get(slot)]);
  }
  return out;
}

Deno.test("C and CUDA validators and bodies read each parameter slot as the struct described there", () => {
  let checked = 0;
  for (const dir of SOURCE_DIRS) {
    for (const e of Deno.readDirSync(new URL(dir, root))) {
      if (!e.isFile || !/\.(c|h|cu|cuh)$/.test(e.name) || e.name.includes(".gen.")) continue;
      for (const [read, slot, described] of structReads(Deno.readTextFileSync(new URL(dir + e.name, root)))) {
        equal(read, described, `${dir}${e.name}: reads ${slot} as mlxn_params_${read}`);
        checked++;
      }
    }
  }
  ok(checked >= 40, `only ${checked} struct reads checked`);
});

Deno.test("the struct-read scan resolves slot aliases and reports a mismatched layout", () => {
  deepStrictEqual(
    structReads(
      "#define P MLXN_SLOT_ELEMENTWISE_ADD_F32_N\nuint32_t n = mlxn_params_n_of(a, P).n;\n" +
        "mlxn_params_norm p = mlxn_params_norm_at(a, MLXN_SLOT_SOFTMAX_F32_SOFTMAX); mlxn_params_norm_of(a, pslot);",
    ),
    [
      ["n", "MLXN_SLOT_ELEMENTWISE_ADD_F32_N", "n"],
      ["norm", "MLXN_SLOT_SOFTMAX_F32_SOFTMAX", "softmax"],
    ],
  );
});

Deno.test("the raw-read scan finds each form it forbids and passes the generated readers", () => {
  deepStrictEqual(rawParamReads("uint32_t n = mlxn_arg_u32(a, 2, 36); float c = arg_f32(a, 4, 20);"), [
    "mlxn_arg_u32(",
    "arg_f32(",
  ]);
  deepStrictEqual(rawParamReads("x = mlxn_arg_f32(a, 3, MLXN_PARAMS_NORM_EPS);"), [
    "mlxn_arg_f32(",
    "MLXN_PARAMS_NORM_EPS",
  ]);
  deepStrictEqual(rawParamReads("memcpy(&v, a.bytes + a.boff[slot] + 4, 4);"), [".bytes +", ".boff["]);
  deepStrictEqual(rawParamReads("kernel void k(constant uint *p [[buffer(2)]]) { uint v = p[0]; }"), [
    "constant uint *p [[buffer(",
  ]);
  deepStrictEqual(rawParamReads("struct gather_params { uint rows; };"), ["struct gather_params {"]);
  deepStrictEqual(
    rawParamReads(
      "MLXN_NEED_BYTES(a, 2, MLXN_PARAMS_SAMPLE_BYTES, err, cap); mlxn_params_sample p = mlxn_params_sample_of(a, 2);" +
        " const mlxn_params_flash f = mlxn_params_flash_at(a, 4); /* was mlxn_arg_u32(a, 2, 0) */" +
        " kernel void k(constant mlxn_params_n &p [[buffer(3)]], device const uint *ids [[buffer(1)]]) {}",
    ),
    [],
  );
});
