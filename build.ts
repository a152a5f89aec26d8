/**
 * Builds the native CPU library from the package's own C sources — what a JSR user runs once:
 *
 * ```sh
 * deno run -A jsr:@mlxn/mlx-native/build            # prints the libPath
 * ```
 *
 * then `MlxDevice.open({ libPath })` (or `MLXN_LIB=<libPath>`). The sources are read next to this
 * file (fetched when the package is remote), written to a cache directory and compiled with $CC,
 * else clang, else cc. Flags: --out <dir> (default: $XDG_CACHE_HOME or ~/.cache, /mlx-native/<version>).
 *
 * @module
 */

import { parseArgs } from "node:util";
import { CPU_CFLAGS, CPU_SOURCES } from "./src/native/sources.ts";

/** Options of {@link buildNative}. */
export interface BuildOptions {
  /** Output directory (default: the user cache directory). */
  outDir?: string;
  /** C compiler (default: $CC, else clang, else cc). */
  cc?: string;
  /** Progress messages (default: silent). */
  log?: (message: string) => void;
}

const VERSION = "0.1.0";

function defaultOutDir(): string {
  const base = Deno.env.get("XDG_CACHE_HOME") ?? `${Deno.env.get("HOME") ?? "."}/.cache`;
  return `${base}/mlx-native/${VERSION}`;
}

async function readSource(rel: string): Promise<Uint8Array> {
  const url = new URL(`./${rel}`, import.meta.url);
  if (url.protocol === "file:") return await Deno.readFile(url);
  const res = await fetch(url);
  if (!res.ok) throw new Error(`could not fetch ${url}: HTTP ${res.status}`);
  return new Uint8Array(await res.arrayBuffer());
}

async function findCompiler(preferred?: string): Promise<string> {
  const candidates = [preferred, Deno.env.get("CC"), "clang", "cc"].filter((c): c is string => !!c);
  for (const cc of candidates) {
    try {
      const out = await new Deno.Command(cc, { args: ["--version"], stdout: "null", stderr: "null" }).output();
      if (out.success) return cc;
    } catch { /* not installed */ }
  }
  throw new Error(`no C compiler found (tried ${candidates.join(", ")}): install clang or gcc, or set CC`);
}

/** Builds the CPU library; resolves to its path. */
export async function buildNative(options: BuildOptions = {}): Promise<string> {
  const log = options.log ?? (() => {});
  const out = options.outDir ?? defaultOutDir();
  const src = `${out}/src`;
  for (const rel of CPU_SOURCES) {
    const path = `${src}/${rel}`;
    await Deno.mkdir(path.slice(0, path.lastIndexOf("/")), { recursive: true });
    await Deno.writeFile(path, await readSource(rel));
  }
  const cc = await findCompiler(options.cc);
  const lib = `${out}/libmlxn_cpu.${Deno.build.os === "darwin" ? "dylib" : "so"}`;
  const args = [
    ...CPU_CFLAGS,
    Deno.build.os === "darwin" ? "-dynamiclib" : "-shared",
    "-o",
    lib,
    ...CPU_SOURCES.filter((f) => f.endsWith(".c")).map((f) => `${src}/${f}`),
    "-ldl",
    "-lm",
  ];
  log(`${cc} ${args.join(" ")}`);
  const res = await new Deno.Command(cc, { args, stdout: "piped", stderr: "piped" }).output();
  if (!res.success) throw new Error(`compiling the native library failed:\n${new TextDecoder().decode(res.stderr)}`);
  return lib;
}

if (import.meta.main) {
  const { values } = parseArgs({ options: { out: { type: "string" }, verbose: { type: "boolean" } } });
  try {
    const lib = await buildNative({ outDir: values.out, log: values.verbose ? console.error : undefined });
    console.log(lib);
  } catch (e) {
    console.error(`mlx-native build: ${e instanceof Error ? e.message : e}`);
    Deno.exit(1);
  }
}
