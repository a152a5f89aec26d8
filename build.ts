/**
 * Builds the native libraries from the package's own sources — what a user of the published package
 * runs once:
 *
 * ```sh
 * deno run -A jsr:@mlxn/mlx-native/build            # prints the library paths
 * ```
 *
 * It builds the CPU library everywhere and, on macOS, the Metal library too. `MlxDevice.open()`
 * then finds them on its own in the default output folder when it may read HOME (run with
 * `--allow-env=HOME,XDG_CACHE_HOME`); otherwise pass a printed path as `MlxDevice.open({ libPath })`
 * or `MLXN_LIB`. The CUDA library needs nvcc and is built from a checkout with `make cuda`.
 *
 * The sources are read next to this file (fetched when the package is remote), written to the
 * output folder and compiled with $CC, else clang, else cc. Flags: `--out <dir>` (default:
 * `$XDG_CACHE_HOME` or `~/.cache`, then `/mlx-native/<version>`), `--verbose`.
 *
 * @module
 */

import { parseArgs } from "node:util";
import {
  buildOutputDir,
  CPU_CFLAGS,
  CPU_SOURCES,
  METAL_OBJC_SOURCE,
  METAL_SHADERS,
  metalCompileArgs,
  metalSourceHeader,
} from "./src/native/sources.ts";

/** Options of {@link buildNative}. */
export interface BuildOptions {
  /** Output directory (default: the build entry's folder in the user cache directory). */
  outDir?: string | undefined;
  /** C compiler (default: $CC, else clang, else cc). */
  cc?: string | undefined;
  /** Also build the Metal library (default: on macOS only; it needs Apple's Metal framework). */
  metal?: boolean | undefined;
  /** Progress messages (default: silent). */
  log?: ((message: string) => void) | undefined;
}

/** The libraries {@link buildAll} built. */
export interface BuiltLibraries {
  /** The CPU library. */
  cpu: string;
  /** The Metal library, when built. */
  metal?: string;
}

function defaultOutDir(): string {
  const dir = buildOutputDir((name) => Deno.env.get(name));
  if (dir === undefined) throw new Error("neither XDG_CACHE_HOME nor HOME is set: pass --out <dir>");
  return dir;
}

async function readSource(rel: string): Promise<Uint8Array> {
  const url = new URL(`./${rel}`, import.meta.url);
  if (url.protocol === "file:") return await Deno.readFile(url);
  const res = await fetch(url);
  if (!res.ok) throw new Error(`could not fetch ${url}: HTTP ${res.status}`);
  return new Uint8Array(await res.arrayBuffer());
}

/** Copies the package files `rels` under `dir`, keeping their relative paths. */
async function stage(dir: string, rels: readonly string[]): Promise<void> {
  for (const rel of rels) {
    const path = `${dir}/${rel}`;
    await Deno.mkdir(path.slice(0, path.lastIndexOf("/")), { recursive: true });
    await Deno.writeFile(path, await readSource(rel));
  }
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

async function compile(cc: string, args: string[], log: (message: string) => void): Promise<void> {
  log(`${cc} ${args.join(" ")}`);
  const res = await new Deno.Command(cc, { args, stdout: "piped", stderr: "piped" }).output();
  if (!res.success) throw new Error(`compiling the native library failed:\n${new TextDecoder().decode(res.stderr)}`);
}

const darwin = Deno.build.os === "darwin";
const cFiles = (src: string) => CPU_SOURCES.filter((f) => f.endsWith(".c")).map((f) => `${src}/${f}`);
const platformFlags = () => darwin ? ["-D_DARWIN_C_SOURCE", "-dynamiclib"] : ["-shared"];

/** Builds the CPU library; resolves to its path. */
export async function buildNative(options: BuildOptions = {}): Promise<string> {
  const log = options.log ?? (() => {});
  const out = options.outDir ?? defaultOutDir();
  const src = `${out}/src`;
  await stage(src, CPU_SOURCES);
  const cc = await findCompiler(options.cc);
  const lib = `${out}/libmlxn_cpu.${darwin ? "dylib" : "so"}`;
  await compile(cc, [...CPU_CFLAGS, ...platformFlags(), "-o", lib, ...cFiles(src), "-ldl", "-lm"], log);
  return lib;
}

/**
 * Builds the Metal library (macOS only): the Objective-C backend over the core, with the MSL sources
 * embedded as a C string; resolves to its path.
 */
export async function buildMetal(options: BuildOptions = {}): Promise<string> {
  if (!darwin) throw new Error("the Metal library builds on macOS only (it links Apple's Metal framework)");
  const log = options.log ?? (() => {});
  const out = options.outDir ?? defaultOutDir();
  const src = `${out}/src`;
  await stage(src, [...CPU_SOURCES, METAL_OBJC_SOURCE]);
  const shaders = await Promise.all(METAL_SHADERS.map(async (f) => new TextDecoder().decode(await readSource(f))));
  await Deno.mkdir(`${out}/gen`, { recursive: true });
  await Deno.writeTextFile(`${out}/gen/mlxn_metal_source.h`, metalSourceHeader(shaders));
  const lib = `${out}/libmlxn_metal.dylib`;
  await compile(options.cc ?? "clang", metalCompileArgs({ src, include: `${out}/gen`, lib }), log);
  return lib;
}

/** Builds every library this OS can run: CPU, and Metal on macOS (unless `metal: false`). */
export async function buildAll(options: BuildOptions = {}): Promise<BuiltLibraries> {
  const cpu = await buildNative(options);
  const metal = (options.metal ?? darwin) ? await buildMetal(options) : undefined;
  return metal ? { cpu, metal } : { cpu };
}

if (import.meta.main) {
  const { values } = parseArgs({ options: { out: { type: "string" }, verbose: { type: "boolean" } } });
  try {
    const built = await buildAll({ outDir: values.out, log: values.verbose ? console.error : undefined });
    for (const path of Object.values(built)) console.log(path);
  } catch (e) {
    console.error(`mlx-native build: ${e instanceof Error ? e.message : e}`);
    Deno.exit(1);
  }
}
