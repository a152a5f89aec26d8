/**
 * The MSL front end (metal_emu/msl_front.ts + metal_emu/include/metal_stdlib): the kernels of
 * kernels/metal/ type-check as the Objective-C backend assembles them, and realistic mistakes planted
 * into a copy of them are each reported, in the file that holds them.
 */
import { deepStrictEqual, equal, match, ok } from "node:assert/strict";
import { allContracts } from "../src/kernels.ts";
import "../src/ops/mod.ts";
import { front, runtimeOrder, typeCheck } from "../metal_emu/msl_front.ts";

const root = new URL("../", import.meta.url);
const hasClang = (() => {
  try {
    return new Deno.Command("clang++", { args: ["--version"], stdout: "null", stderr: "null" }).outputSync().success;
  } catch {
    return false;
  }
})();
const metalFiles = () =>
  runtimeOrder([...Deno.readDirSync(new URL("kernels/metal/", root))].map((e) => `kernels/metal/${e.name}`));

/** Front end + clang++ over a copy of the kernels with one edit; returns every diagnostic text. */
async function checkPlanted(file: string, from: string, to: string): Promise<{ ok: boolean; text: string }> {
  const dir = await Deno.makeTempDir({ prefix: "mlxn-msl-" });
  try {
    await Deno.mkdir(`${dir}/kernels/metal`, { recursive: true });
    for (const f of metalFiles()) {
      let text = Deno.readTextFileSync(new URL(f, root));
      if (f === file) {
        ok(text.includes(from), `the plant's anchor is missing from ${file}: ${from}`);
        text = text.replace(from, to);
      }
      Deno.writeTextFileSync(`${dir}/${f}`, text);
    }
    const r = await front(metalFiles(), new URL(`file://${dir}/`));
    if (r.stderr) return { ok: false, text: r.stderr };
    if (r.diagnostics.length > 0) {
      return { ok: false, text: r.diagnostics.map((d) => `${d.file}:${d.line}: error: ${d.message}`).join("\n") };
    }
    const tc = await typeCheck(r.cpp);
    return { ok: tc.ok, text: tc.stderr };
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test({
  name: "every MSL kernel type-checks as assembled at run time, and the kernels are exactly the contracts",
  ignore: !hasClang,
}, async () => {
  const r = await front(metalFiles(), root);
  equal(r.stderr, "");
  deepStrictEqual(r.diagnostics, []);
  const tc = await typeCheck(r.cpp);
  ok(tc.ok, tc.stderr);
  deepStrictEqual(r.kernels.map((k) => k.name).sort(), allContracts().map((c) => c.name).sort());
  // The prelude comes first, as objc/mlxn_metal.m compiles it.
  equal(metalFiles()[0], "kernels/metal/common.metal");
});

const plants: { what: string; file: string; from: string; to: string; expect: RegExp }[] = [
  {
    what: "address space: a threadgroup pointer passed where device memory is expected",
    file: "kernels/metal/common.metal",
    from: "inline float tg_sum(float v, threadgroup float *sh, uint i, uint n) {",
    to: "inline float tg_sum(float v, device float *sh, uint i, uint n) {",
    expect: /no matching function for call to 'tg_sum'|address space/,
  },
  {
    what: "address space: device memory read through a thread pointer",
    file: "kernels/metal/rope.metal",
    from: "float x0 = in[j], x1 = in[j + 1];",
    to: "const float *row = in + j; float x0 = row[0], x1 = row[1];",
    expect:
      /rope\.metal:11:\d+: error: cannot initialize a variable of type 'const float \*' with an rvalue of type 'device float const \*'/,
  },
  {
    what: "missing cast: a uint vector assigned to a float vector",
    file: "kernels/metal/rope.metal",
    from: "float x0 = in[j], x1 = in[j + 1];",
    to: "float2 at = uint2(i, t); float x0 = in[j] + at.x, x1 = in[j + 1];",
    expect:
      /rope\.metal:11:\d+: error: cannot initialize a variable of type 'metal::float2'.*vector of 2 'unsigned int'/,
  },
  {
    what: "a C-style cast to a vector type (element-wise in MSL, a bit cast in C++)",
    file: "kernels/metal/rope.metal",
    from: "float x0 = in[j], x1 = in[j + 1];",
    to: "float2 at = (float2)uint2(i, t); float x0 = in[j] + at.x, x1 = in[j + 1];",
    expect: /rope\.metal:11: error: write float2\(x\) to convert to a vector type/,
  },
  {
    what: "missing cast: a uchar row read as ushort",
    file: "kernels/metal/matmul.metal",
    from: "device const uchar *wr = w + n * row_bytes;",
    to: "device const ushort *wr = w + n * row_bytes;",
    expect:
      /cannot initialize a variable of type 'device ushort const \*'.* with an rvalue of type 'device uchar const \*'/,
  },
  {
    what: "unknown builtin: a CUDA warp shuffle",
    file: "kernels/metal/matmul.metal",
    from: "    acc = simd_sum(acc);                                ",
    to: "    acc = __shfl_xor_sync(0xffffffffu, acc, 16);        ",
    expect: /use of undeclared identifier '__shfl_xor_sync'/,
  },
  {
    what: "double",
    file: "kernels/metal/attention.metal",
    from: "float m = -INFINITY, l = 0.0f;  ",
    to: "float m = -INFINITY; double l = 0;",
    expect: /double_is_not_supported_in_MSL/,
  },
  {
    what: "attribute: [[buffer(n)]] on a threadgroup pointer",
    file: "kernels/metal/norm.metal",
    from: "threadgroup float *sh [[threadgroup(0)]], MLXN_ARGS_TAIL) {             \\",
    to: "threadgroup float *sh [[buffer(6)]], MLXN_ARGS_TAIL) {                  \\",
    expect:
      /norm\.metal:\d+: error: parameter 'sh' of kernel rms_norm_f32: \[\[buffer\(6\)\]\] needs a 'device' or 'constant'/,
  },
  {
    what: "attribute: [[threadgroup(0)]] on a device pointer",
    file: "kernels/metal/norm.metal",
    from: "threadgroup float *sh [[threadgroup(0)]], MLXN_ARGS_TAIL) {             \\",
    to: "device float *sh [[threadgroup(0)]], MLXN_ARGS_TAIL) {                  \\",
    expect: /needs a 'threadgroup' pointer, not 'device float \*'/,
  },
  {
    what: "attribute: a thread position as float",
    file: "kernels/metal/attention.metal",
    from: "uint lane [[thread_index_in_simdgroup]]) {",
    to: "float lane [[thread_index_in_simdgroup]]) {",
    expect: /attention\.metal:\d+: error: .*\[\[thread_index_in_simdgroup\]\] needs one of uint, ushort, not 'float'/,
  },
  {
    what: "attribute: one buffer index bound twice",
    file: "kernels/metal/elementwise.metal",
    from: "device T *out [[buffer(2)]], constant mlxn_params_n &p [[buffer(3)]],",
    to: "device T *out [[buffer(2)]], constant mlxn_params_n &p [[buffer(2)]],",
    expect: /\[\[buffer\(2\)\]\] is already bound to parameter 'out'/,
  },
  {
    what: "attribute: an unknown attribute",
    file: "kernels/metal/elementwise.metal",
    from: "constant mlxn_params_debug_fault &p [[buffer(1)]]",
    to: "constant mlxn_params_debug_fault &p [[buffer_index(1)]]",
    expect:
      /elementwise\.metal:\d+: error: parameter 'p' of kernel debug_fault: unknown attribute \[\[buffer_index\(1\)\]\]/,
  },
  {
    what: "attribute: a parameter without one",
    file: "kernels/metal/elementwise.metal",
    from: "device uint *marker [[buffer(0)]]",
    to: "device uint *marker",
    expect: /parameter 'marker' of kernel debug_fault needs exactly one attribute/,
  },
];

for (const p of plants) {
  Deno.test({ name: `metal-check catches a planted mistake: ${p.what}`, ignore: !hasClang }, async () => {
    const r = await checkPlanted(p.file, p.from, p.to);
    ok(!r.ok, `not caught: ${p.what}`);
    match(r.text, p.expect);
    ok(r.text.includes(p.file), `the diagnostic names ${p.file}:\n${r.text}`);
  });
}
