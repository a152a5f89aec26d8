/**
 * The MSL front end of the Metal emulator: turns the kernels of kernels/metal/, assembled exactly
 * as the Objective-C backend assembles them at run time, into C++ that clang type-checks against
 * the project's emulation of `<metal_stdlib>` (metal_emu/include/) and that the emulated backend
 * executes.
 *
 * Two passes. The first is clang's preprocessor with a stub `<metal_stdlib>`, so every macro of the
 * kernels is expanded while MSL's keywords (`kernel`, `device`, …) stay visible. This module then
 * checks each kernel's signature the way Apple's compiler does (a void result, one known attribute
 * per parameter, `[[buffer(n)]]` only on device/constant pointers or references, `[[threadgroup(n)]]`
 * only on threadgroup pointers, thread-position attributes only on their scalar or vector types, no
 * index bound twice), strips the attributes, and appends one C entry point per kernel plus the
 * kernel table. The second pass is clang++ on that text with the real emulated header.
 *
 * Usage: `deno run --allow-read --allow-write --allow-run --allow-env metal_emu/msl_front.ts
 * [--check] [--out FILE] FILE.metal…` (the files in the order the runtime concatenates them).
 * `--check` also type-checks the result with clang++ and exits non-zero on any error.
 *
 * @module
 */

/** One problem found in the MSL, located in its source file. */
export interface MslDiagnostic {
  /** Source file of the problem (as named in the assembled source). */
  file: string;
  /** 1-based line. */
  line: number;
  /** What is wrong and what to write instead. */
  message: string;
}

/** A kernel function found in the MSL. */
export interface MslKernel {
  /** The kernel's name (what the host looks up). */
  name: string;
  /** Bit n set: the kernel declares `[[buffer(n)]]`. */
  buffers: number;
  /** Bit n set: the kernel declares `[[threadgroup(n)]]`. */
  threadgroup: number;
}

/** The front end's result. */
export interface MslFrontResult {
  /** C++ for the second pass (empty when there are diagnostics). */
  cpp: string;
  /** Kernels, in source order. */
  kernels: MslKernel[];
  /** Signature errors (the C++ type check adds its own). */
  diagnostics: MslDiagnostic[];
}

const ROOT = new URL("../", import.meta.url);
const INCLUDE_DIR = new URL("include/", import.meta.url).pathname;
const PASS1_DIR = new URL("pass1/", import.meta.url).pathname;

/** Predefined macros of Apple's Metal compiler that kernels may test. */
const METAL_DEFINES = [
  "-D__METAL_VERSION__=300",
  "-D__METAL__=1",
  "-D__METAL_MACOS__=1",
  "-D__HAVE_MAX_TOTAL_THREADS__",
];

/**
 * Flags of the second pass: C++14 (the base of MSL 2 and 3), no system headers (a kernel can only
 * include what Metal offers), half as a native arithmetic type, IEEE arithmetic (the Objective-C
 * backend compiles with fast math off).
 */
export const CXX_FLAGS: readonly string[] = [
  "-x",
  "c++",
  "-std=c++14",
  "-nostdinc",
  "-nostdinc++",
  `-I${INCLUDE_DIR}`,
  "-Xclang",
  "-fnative-half-type",
  "-Xclang",
  "-fnative-half-arguments-and-returns",
  "-ffp-contract=off",
  "-fno-exceptions",
  "-fno-rtti",
  "-fsigned-char",
  "-Wall",
  "-Wno-unused-function",
  "-Wno-unused-variable",
  ...METAL_DEFINES,
];

/** The C++ compiler: $CXX when set and readable, else clang++. */
export function cxx(): string {
  try {
    return Deno.env.get("CXX") || "clang++";
  } catch {
    return "clang++";
  }
}

/**
 * The MSL source as the Objective-C backend compiles it: the files concatenated in the given order
 * (common.metal first), each preceded by a `#line` so that diagnostics name the real file.
 */
export function assemble(files: readonly { name: string; text: string }[]): string {
  return files.map((f) => `#line 1 "${f.name}"\n${f.text.endsWith("\n") ? f.text : f.text + "\n"}`).join("");
}

/**
 * The order the Makefile concatenates kernels/metal/*.metal in (build/mlxn_metal_source.h): the
 * prelude common.metal first, then the others sorted by name.
 */
export function runtimeOrder(paths: readonly string[]): string[] {
  const isPrelude = (p: string) => /(^|\/)common\.metal$/.test(p);
  return [...paths.filter(isPrelude), ...paths.filter((p) => !isPrelude(p) && p.endsWith(".metal")).sort()];
}

/** Runs clang's preprocessor (first pass) over assembled MSL. */
export async function preprocess(source: string): Promise<{ ok: boolean; text: string; stderr: string }> {
  const cmd = new Deno.Command(cxx(), {
    args: ["-x", "c++", "-std=c++14", "-E", "-nostdinc", "-nostdinc++", `-I${PASS1_DIR}`, ...METAL_DEFINES, "-"],
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  });
  let child: Deno.ChildProcess;
  try {
    child = cmd.spawn();
  } catch (e) {
    const why = e instanceof Deno.errors.NotFound ? "not found" : String(e);
    return {
      ok: false,
      text: "",
      stderr: `the MSL front end needs clang++ (${cxx()}: ${why}); install clang or set CXX`,
    };
  }
  const writer = child.stdin.getWriter();
  await writer.write(new TextEncoder().encode(source));
  await writer.close();
  const out = await child.output();
  const dec = new TextDecoder();
  return { ok: out.success, text: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

/** The scalar and vector types each thread-position attribute accepts. */
const VECTOR_POSITION = ["uint", "uint2", "uint3", "ushort", "ushort2", "ushort3"];
const SCALAR_POSITION = ["uint", "ushort"];
const POSITION_ATTRIBUTES: Record<string, { id: number; types: string[] }> = {
  thread_position_in_grid: { id: 0, types: VECTOR_POSITION },
  threadgroup_position_in_grid: { id: 1, types: VECTOR_POSITION },
  thread_position_in_threadgroup: { id: 2, types: VECTOR_POSITION },
  threads_per_threadgroup: { id: 3, types: VECTOR_POSITION },
  threadgroups_per_grid: { id: 4, types: VECTOR_POSITION },
  threads_per_grid: { id: 5, types: VECTOR_POSITION },
  thread_index_in_threadgroup: { id: 6, types: SCALAR_POSITION },
  simdgroup_index_in_threadgroup: { id: 7, types: SCALAR_POSITION },
  thread_index_in_simdgroup: { id: 8, types: SCALAR_POSITION },
  threads_per_simdgroup: { id: 9, types: SCALAR_POSITION },
  simdgroups_per_threadgroup: { id: 10, types: SCALAR_POSITION },
  thread_execution_width: { id: 11, types: SCALAR_POSITION },
};

/** Maps offsets of preprocessed text to the file and line the `# N "file"` markers name. */
class LineMap {
  #marks: { offset: number; line: number; file: string }[] = [];
  constructor(private text: string) {
    const re = /^# (\d+) "([^"]*)"[^\n]*\n/gm;
    for (const m of text.matchAll(re)) {
      this.#marks.push({ offset: m.index! + m[0].length, line: Number(m[1]), file: m[2]! });
    }
  }
  at(offset: number): { file: string; line: number } {
    let mark = { offset: 0, line: 1, file: "<msl>" };
    for (const m of this.#marks) {
      if (m.offset > offset) break;
      mark = m;
    }
    let line = mark.line;
    for (let i = mark.offset; i < offset; i++) if (this.text.charCodeAt(i) === 10) line++;
    return { file: mark.file, line };
  }
}

/** Index of the bracket closing the one at `open`, or -1. */
function matching(text: string, open: number): number {
  const pairs: Record<string, string> = { "(": ")", "[": "]", "{": "}" };
  const stack: string[] = [];
  for (let i = open; i < text.length; i++) {
    const c = text[i]!;
    if (c in pairs) stack.push(pairs[c]!);
    else if (c === ")" || c === "]" || c === "}") {
      if (stack.pop() !== c) return -1;
      if (stack.length === 0) return i;
    }
  }
  return -1;
}

/** Splits a parameter list at its top-level commas. */
function splitParams(list: string): { text: string; offset: number }[] {
  const out: { text: string; offset: number }[] = [];
  let depth = 0, start = 0;
  for (let i = 0; i < list.length; i++) {
    const c = list[i];
    if (c === "(" || c === "[" || c === "<" || c === "{") depth++;
    else if (c === ")" || c === "]" || c === ">" || c === "}") depth--;
    else if (c === "," && depth === 0) {
      out.push({ text: list.slice(start, i), offset: start });
      start = i + 1;
    }
  }
  if (list.slice(start).trim() !== "") out.push({ text: list.slice(start), offset: start });
  return out;
}

interface Param {
  type: string;
  name: string;
  attr: string;
  args: string;
}

const SPACE_WORDS = ["device", "constant", "threadgroup", "thread"];

/** The address-space keyword of a parameter type, if any. */
function spaceOf(type: string): string | undefined {
  return type.split(/[^\w]+/).find((w) => SPACE_WORDS.includes(w));
}

/** Checks one kernel parameter; returns a problem or undefined. */
function checkParam(p: Param, kernel: string, seen: Map<string, string>): string | undefined {
  const where = `parameter '${p.name}' of kernel ${kernel}`;
  const space = spaceOf(p.type);
  const indirect = /[*&]\s*$/.test(p.type.trim());
  if (p.attr === "buffer" || p.attr === "threadgroup") {
    if (!/^\s*\d+\s*$/.test(p.args)) return `${where}: [[${p.attr}(n)]] needs an integer index, got '${p.args}'`;
    const index = Number(p.args);
    if (index > 30) return `${where}: [[${p.attr}(${index})]] is out of range (Metal has argument slots 0-30)`;
    const key = `${p.attr}(${index})`;
    if (seen.has(key)) return `${where}: [[${key}]] is already bound to parameter '${seen.get(key)}'`;
    seen.set(key, p.name);
    if (p.attr === "buffer") {
      if (!indirect || (space !== "device" && space !== "constant")) {
        return `${where}: [[buffer(${index})]] needs a 'device' or 'constant' pointer or reference, not '${p.type.trim()}'`;
      }
    } else if (!/\*\s*$/.test(p.type.trim()) || space !== "threadgroup") {
      return `${where}: [[threadgroup(${index})]] needs a 'threadgroup' pointer, not '${p.type.trim()}'`;
    }
    return undefined;
  }
  const pos = POSITION_ATTRIBUTES[p.attr];
  if (!pos) {
    const known = ["buffer(n)", "threadgroup(n)", ...Object.keys(POSITION_ATTRIBUTES)].join(", ");
    return `${where}: unknown attribute [[${p.attr}${p.args ? `(${p.args})` : ""}]] (kernel parameters take ${known})`;
  }
  if (p.args) return `${where}: [[${p.attr}]] takes no arguments`;
  const base = p.type.replace(/\bconst\b/g, "").replace(/\bmetal::/g, "").trim();
  if (!pos.types.includes(base)) {
    return `${where}: [[${p.attr}]] needs one of ${pos.types.join(", ")}, not '${p.type.trim()}'`;
  }
  if (seen.has(p.attr)) return `${where}: [[${p.attr}]] is already declared by parameter '${seen.get(p.attr)}'`;
  seen.set(p.attr, p.name);
  return undefined;
}

/** Decimal floating literals without a suffix: MSL has no double, so they are float. */
const UNSUFFIXED_FLOAT = /(?<![\w.])((?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)(?![\w.])/g;
/** A threadgroup variable declared in a kernel body: `threadgroup T name[N]...;` (no initialiser). */
const THREADGROUP_VARIABLE =
  /(?<=[;{}]\s*)threadgroup\s+((?:const\s+)?[\w:]+(?:\s*<[^;>]*>)?)\s+(\w+)\s*((?:\[[^\]]+\]\s*)*);/g;
/** Casts to a vector type: `(float4)x`, `static_cast<float4>(x)`. */
const VECTOR_CAST =
  /\(\s*(?:metal::)?((?:float|half|int|uint|short|ushort|char|uchar|long|ulong)[234])\s*\)\s*[\w(.-]|static_cast\s*<\s*(?:metal::)?((?:float|half|int|uint|short|ushort|char|uchar|long|ulong)[234])\s*>/g;
/** Vector constructors, which must convert element-wise (a C cast between clang vectors would not). */
const VECTOR_CONSTRUCTOR = /(?<![\w.:])((?:float|half|int|uint|short|ushort|char|uchar|long|ulong)[234])\s*\(/g;

/** Runs the signature checks and the rewrite over preprocessed MSL (see the module comment). */
export function transform(pre: string): MslFrontResult {
  const lines = new LineMap(pre);
  const diagnostics: MslDiagnostic[] = [];
  const kernels: MslKernel[] = [];
  const entries: string[] = [];
  const report = (offset: number, message: string) => diagnostics.push({ ...lines.at(offset), message });

  const marker = pre.search(/^#pragma mlxn_include metal_stdlib\s*$/m);
  if (marker < 0) {
    report(0, "the kernels must `#include <metal_stdlib>` (the prelude, common.metal, does)");
    return { cpp: "", kernels, diagnostics };
  }
  // Edits as [start, end, replacement], applied back to front.
  const edits: [number, number, string][] = [];
  // `kernel void f(` or `[[kernel]] void f(`.
  const kernelRe = /\[\[\s*kernel\s*\]\]|\bkernel\b/g;
  for (const m of pre.matchAll(kernelRe)) {
    const at = m.index!;
    const head = /^(?:\[\[\s*kernel\s*\]\]|kernel)\s+(\w+)\s+(\w+)\s*\(/.exec(pre.slice(at));
    if (m[0] === "kernel" && pre.slice(Math.max(0, at - 2), at) === "[[") continue; // inside [[kernel]]
    if (!head) {
      report(at, "'kernel' must introduce a function: `kernel void name(...)`");
      continue;
    }
    const result = head[1]!, name = head[2]!;
    if (result !== "void") report(at, `kernel ${name} must return void, not ${result}`);
    const open = at + head[0].length - 1;
    const close = matching(pre, open);
    if (close < 0) {
      report(at, `kernel ${name}: unbalanced parameter list`);
      continue;
    }
    edits.push([at, at + m[0].length, "static"]);
    const params: Param[] = [];
    const seen = new Map<string, string>();
    let buffers = 0, threadgroup = 0;
    for (const raw of splitParams(pre.slice(open + 1, close))) {
      const abs = open + 1 + raw.offset;
      const attrs = [...raw.text.matchAll(/\[\[\s*([\s\S]*?)\s*\]\]/g)];
      for (const a of attrs) edits.push([abs + a.index!, abs + a.index! + a[0].length, ""]);
      const decl = raw.text.replace(/\[\[[\s\S]*?\]\]/g, " ").trim();
      const nameMatch = /(\w+)\s*$/.exec(decl);
      if (!nameMatch || decl.length === nameMatch[0].length) {
        report(abs, `kernel ${name}: every parameter needs a type and a name ('${decl}')`);
        continue;
      }
      const pname = nameMatch[1]!;
      const type = decl.slice(0, decl.length - nameMatch[0].length).trim();
      if (attrs.length !== 1) {
        report(
          abs,
          `parameter '${pname}' of kernel ${name} needs exactly one attribute ([[buffer(n)]], ` +
            `[[threadgroup(n)]] or a thread-position attribute); it has ${attrs.length}`,
        );
        continue;
      }
      const am = /^(\w+)\s*(?:\(([\s\S]*)\))?$/.exec(attrs[0]![1]!);
      if (!am) {
        report(abs, `parameter '${pname}' of kernel ${name}: malformed attribute [[${attrs[0]![1]}]]`);
        continue;
      }
      const p: Param = { type, name: pname, attr: am[1]!, args: (am[2] ?? "").trim() };
      const problem = checkParam(p, name, seen);
      if (problem) {
        report(abs, problem);
        continue;
      }
      if (p.attr === "buffer") buffers |= 1 << Number(p.args);
      if (p.attr === "threadgroup") threadgroup |= 1 << Number(p.args);
      params.push(p);
    }
    kernels.push({ name, buffers, threadgroup });
    const args = params.map((p) => {
      if (p.attr === "buffer") return `::mlxn_emu_bind::buffer<${p.type}>(__b[${Number(p.args)}])`;
      if (p.attr === "threadgroup") return `::mlxn_emu_bind::buffer<${p.type}>(__t[${Number(p.args)}])`;
      return `::mlxn_emu_bind::position<${p.type.replace(/\bconst\b/g, "").trim()}>(__p[${
        POSITION_ATTRIBUTES[p.attr]!.id
      }])`;
    });
    entries.push(
      `extern "C" void __mlxn_emu_entry_${name}(void *const *__b, void *const *__t, const unsigned (*__p)[3]) {\n` +
        `  ${name}(${args.join(", ")});\n}\n`,
    );
  }
  // Literals and vector constructors in the kernels' own text (not in header lines).
  const inMarker = (at: number) => pre[pre.lastIndexOf("\n", at - 1) + 1] === "#";
  for (const m of pre.matchAll(UNSUFFIXED_FLOAT)) {
    if (!inMarker(m.index!)) edits.push([m.index! + m[0].length, m.index! + m[0].length, "f"]);
  }
  // `threadgroup T name[N];` in a kernel: one allocation per threadgroup from the runtime (C++ has
  // no automatic variables in another address space).
  for (const m of pre.matchAll(THREADGROUP_VARIABLE)) {
    const [all, type, name, dims] = m;
    const whole = `${type}${dims}`;
    edits.push([
      m.index!,
      m.index! + all.length,
      `threadgroup ${type} (&${name})${dims} = *(threadgroup ${type} (*)${dims})mlxn_emu_threadgroup_variable(` +
      `sizeof(${whole.replace(/\s+/g, " ")}), alignof(${type}));`,
    ]);
  }
  for (const m of pre.matchAll(VECTOR_CONSTRUCTOR)) {
    edits.push([m.index!, m.index! + m[1]!.length, `metal::__make<metal::${m[1]}>`]);
  }
  // A C-style or static_cast to a vector type converts element-wise in MSL but is a bit cast
  // between clang's vectors: refuse it rather than compute something else.
  for (const m of pre.matchAll(VECTOR_CAST)) {
    if (inMarker(m.index!)) continue;
    report(m.index!, `write ${m[1] ?? m[2]}(x) to convert to a vector type: the emulator cannot reproduce a cast`);
  }
  if (diagnostics.length > 0) return { cpp: "", kernels, diagnostics };

  edits.sort((a, b) => b[0] - a[0] || b[1] - a[1]);
  let body = pre;
  for (const [s, e, r] of edits) body = body.slice(0, s) + r + body.slice(e);
  body = body.replace(
    /^#pragma mlxn_include metal_stdlib\s*$/m,
    "#include <metal_stdlib>\n#include <metal_emu_bind.h>",
  );
  const table = kernels.map((k) =>
    `  {"${k.name}", __mlxn_emu_entry_${k.name}, 0x${(k.buffers >>> 0).toString(16)}u, 0x${
      (k.threadgroup >>> 0).toString(16)
    }u},`
  );
  const cpp = `${body}\n#line 1 "<kernel entry points>"\n${entries.join("")}` +
    `extern "C" const mlxn_emu_kernel mlxn_emu_kernels[] = {\n${table.join("\n")}\n  {0, 0, 0, 0},\n};\n`;
  return { cpp, kernels, diagnostics };
}

/** Front end over the given .metal files (paths relative to the repository root or absolute). */
export async function front(paths: readonly string[], root: URL = ROOT): Promise<MslFrontResult & { stderr: string }> {
  const files = paths.map((p) => ({ name: p, text: Deno.readTextFileSync(new URL(p, root)) }));
  const pre = await preprocess(assemble(files));
  if (!pre.ok) return { cpp: "", kernels: [], diagnostics: [], stderr: pre.stderr };
  return { ...transform(pre.text), stderr: "" };
}

/** Type-checks generated C++ with clang++ (second pass); returns clang's diagnostics. */
export async function typeCheck(cpp: string): Promise<{ ok: boolean; stderr: string }> {
  const child = new Deno.Command(cxx(), {
    args: [...CXX_FLAGS, "-fsyntax-only", "-"],
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const writer = child.stdin.getWriter();
  await writer.write(new TextEncoder().encode(cpp));
  await writer.close();
  const out = await child.output();
  return { ok: out.success, stderr: new TextDecoder().decode(out.stderr) };
}

/** Formats diagnostics as a compiler would. */
export function formatDiagnostics(ds: readonly MslDiagnostic[]): string {
  return ds.map((d) => `${d.file}:${d.line}: error: ${d.message}`).join("\n");
}

if (import.meta.main) {
  const args = [...Deno.args];
  let out: string | undefined;
  let check = false;
  const files: string[] = [];
  while (args.length > 0) {
    const a = args.shift()!;
    if (a === "--out") out = args.shift();
    else if (a === "--check") check = true;
    else files.push(a);
  }
  if (files.length === 0) {
    console.error("usage: msl_front.ts [--check] [--out FILE.cpp] FILE.metal...");
    Deno.exit(2);
  }
  const cwd = new URL(`file://${Deno.cwd()}/`);
  const r = await front(files, cwd);
  if (r.stderr) {
    console.error(r.stderr);
    Deno.exit(1);
  }
  if (r.diagnostics.length > 0) {
    console.error(formatDiagnostics(r.diagnostics));
    console.error(`${r.diagnostics.length} error(s) in the MSL kernel signatures`);
    Deno.exit(1);
  }
  if (check) {
    const tc = await typeCheck(r.cpp);
    if (tc.stderr) console.error(tc.stderr.trimEnd());
    if (!tc.ok) Deno.exit(1);
    console.log(`MSL: ${r.kernels.length} kernels type-checked (${files.length} files, as assembled at run time)`);
  }
  if (out) Deno.writeTextFileSync(out, r.cpp);
}
