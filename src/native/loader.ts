/**
 * Finds, permission-checks and loads a backend's native library. The only module that calls
 * `Deno.dlopen`.
 *
 * Discovery order: an explicit path > MLXN_LIB (read only when the env permission is already
 * granted) > the module's own build/ directory > the build entry's output folder. The ffi
 * permission is queried first, so a missing grant is a clear PermissionDenied naming the flag —
 * never a prompt, never "library not found". Errors name the fix for where the path came from: the
 * backend's build command, or MLXN_LIB itself when the variable is wrong.
 *
 * @module
 */

import { type BackendName, envConfig, readEnvIfGranted } from "../config.ts";
import { MlxError } from "../errors.ts";
import { ABI_VERSION } from "./abi.ts";
import { type NativeSymbols, symbols } from "./ffi.ts";
import { buildOutputDir, PACKAGE_VERSION } from "./sources.ts";

/** A loaded native library. */
export interface NativeLibrary {
  /** The file it was loaded from. */
  readonly path: string;
  /** Its symbols. */
  readonly symbols: NativeSymbols;
}

/** File name of a backend's library on this OS. */
export function libraryFileName(backend: BackendName): string {
  if (backend === "metal") return "libmlxn_metal.dylib";
  if (backend === "metal-emu") return `libmlxn_metal_emu.${Deno.build.os === "darwin" ? "dylib" : "so"}`;
  return `libmlxn_${backend}.${Deno.build.os === "darwin" ? "dylib" : "so"}`;
}

/** The module's own build directory, when the module is loaded from local files. */
export function moduleBuildDir(moduleUrl: string = import.meta.url): string | undefined {
  const url = new URL("../../build/", moduleUrl);
  if (url.protocol !== "file:") return undefined;
  let path = decodeURIComponent(url.pathname);
  if (Deno.build.os === "windows") path = path.replace(/^\/([A-Za-z]:)/, "$1");
  return path.replace(/\/$/, "");
}

/**
 * Where a backend's library is looked for, in order: the module's own build/ directory (a checkout
 * built with make), then the build entry's output folder (when HOME or XDG_CACHE_HOME is readable).
 */
export function libraryCandidates(
  backend: BackendName,
  moduleUrl: string = import.meta.url,
  readEnv: (name: string) => string | undefined = readEnvIfGranted,
): string[] {
  return [moduleBuildDir(moduleUrl), buildOutputDir(readEnv)]
    .filter((d): d is string => d !== undefined)
    .map((d) => `${d}/${libraryFileName(backend)}`);
}

/**
 * The default library path of a backend: the first candidate known to exist, else the first one
 * whose existence cannot be checked without a prompt, else the first candidate (whose load then
 * fails with the build command). Throws LibraryNotFound when there is no candidate at all: a
 * remote import that may not read HOME.
 */
export function defaultLibraryPath(backend: BackendName): string {
  const candidates = libraryCandidates(backend);
  if (candidates.length === 0) throw unlocatable();
  const known = candidates.map(libraryExists);
  const i = known.indexOf(true);
  if (i >= 0) return candidates[i]!;
  const unknown = known.indexOf(undefined);
  return candidates[unknown >= 0 ? unknown : 0]!;
}

/** Whether a library file exists: true, false, or undefined when checking it needs a permission. */
function libraryExists(path: string): boolean | undefined {
  if (loaded.has(path)) return true;
  if (granted({ name: "read", path })) {
    try {
      return Deno.statSync(path).isFile;
    } catch {
      return false;
    }
  }
  if (!ffiGranted(path)) return undefined;
  try {
    Deno.dlopen(path, {}).close();
    return true;
  } catch (e) {
    return !isMissingFile(e); // exists but does not load: loadLibrary says why
  }
}

function granted(desc: Deno.PermissionDescriptor): boolean {
  try {
    return Deno.permissions.querySync(desc).state === "granted";
  } catch {
    return false;
  }
}

function isMissingFile(e: unknown): boolean {
  return /no such file|not found|cannot find|image not found/i.test(e instanceof Error ? e.message : String(e));
}

/** The command that builds a backend's library, for the way this module was imported. */
export function buildCommand(backend: BackendName, moduleUrl: string = import.meta.url): string {
  const root = moduleBuildDir(moduleUrl)?.replace(/\/build$/, "");
  if (root !== undefined) {
    const target = backend === "cpu" ? "native" : backend;
    return `\`make ${target}\` in ${root}` + (backend === "cuda" ? " (needs nvcc)" : "");
  }
  const entry = new URL("../../build.ts", moduleUrl).href;
  if (backend === "cuda") {
    return `\`make cuda\` (needs nvcc) in a checkout of mlx-native — the build entry builds only the ` +
      `CPU and Metal libraries — then pass its path as MlxDevice.open({ libPath }) or MLXN_LIB`;
  }
  return `\`deno run -A ${entry}\`` + (backend === "metal" ? " on macOS" : "");
}

function unlocatable(): MlxError {
  return new MlxError(
    "LibraryNotFound",
    `mlx-native was imported from ${new URL("../../", import.meta.url).href}, so its native libraries are ` +
      `looked for in the build entry's output folder ($XDG_CACHE_HOME or $HOME/.cache, then mlx-native/` +
      `${PACKAGE_VERSION}), and finding that folder needs --allow-env=HOME,XDG_CACHE_HOME: grant it, or pass ` +
      `MlxDevice.open({ libPath }) (or MLXN_LIB). The CPU library (and Metal on macOS) is built with ` +
      `${buildCommand("cpu")}; the CUDA library with ${buildCommand("cuda")}.`,
  );
}

/** Whether FFI access to `path` is already granted (never prompts). */
export function ffiGranted(path: string): boolean {
  try {
    return Deno.permissions.querySync({ name: "ffi", path }).state === "granted";
  } catch {
    return false;
  }
}

/** Throws PermissionDenied unless FFI access to `path` is granted. */
export function assertFfiGranted(path: string): void {
  if (ffiGranted(path)) return;
  throw new MlxError(
    "PermissionDenied",
    `mlx-native needs FFI access to load its native library ${path}: run with ` +
      `--allow-ffi=${path} (or --allow-ffi). Pure-TS parts (graphs, passes, trackers) need no permission.`,
  );
}

const loaded = new Map<string, NativeLibrary>();

/** Where a library path came from, for an error that says what to fix. */
function origin(path: string): "env" | "default" | "option" {
  if (path === envConfig().lib) return "env";
  const backend = backendOfFile(path);
  return backend && libraryCandidates(backend).includes(path) ? "default" : "option";
}

function backendOfFile(path: string): BackendName | undefined {
  return /libmlxn_(cpu|cuda|metal)\.(so|dylib)$/.exec(path)?.[1] as BackendName | undefined;
}

/** What to do about a library that is missing, unloadable or of another ABI. */
function remedy(path: string, problem: "missing" | "unloadable" | "abi"): string {
  const from = origin(path);
  if (from === "env") {
    return `MLXN_LIB=${path} is wrong: point MLXN_LIB at a library built from this release, or unset it ` +
      `to use the default`;
  }
  const build = `build it with ${buildCommand(backendOfFile(path) ?? "cpu")}`;
  const fix = problem === "missing" ? build : `re${build}`;
  return from === "option" ? `${fix}, or check the libPath given to MlxDevice.open` : fix;
}

function dlopenError(path: string, e: unknown): MlxError {
  const msg = e instanceof Error ? e.message : String(e);
  if (isMissingFile(e)) {
    return new MlxError(
      "LibraryNotFound",
      `native library ${path} does not exist: ${remedy(path, "missing")}. (${msg})`,
      { cause: e },
    );
  }
  return new MlxError(
    "LibraryLoadFailed",
    `native library ${path} exists but could not be loaded (${msg}): ${remedy(path, "unloadable")}; ` +
      `check that the file is readable and built for this OS and architecture.`,
    { cause: e },
  );
}

/**
 * The symbols of a library loaded in this process, or null when none is: for native functions that
 * involve no device (every loaded library speaks this module's ABI).
 */
export function anyLoadedSymbols(): NativeSymbols | null {
  for (const lib of loaded.values()) return lib.symbols;
  return null;
}

/**
 * Loads the library at `path` (once per process): checks the permission, then the ABI version
 * through a minimal first open, then binds every symbol.
 */
export function loadLibrary(path: string): NativeLibrary {
  const hit = loaded.get(path);
  if (hit) return hit;
  assertFfiGranted(path);
  let probe: Deno.DynamicLibrary<{ mlxn_abi_version: { parameters: []; result: "u32" } }>;
  try {
    probe = Deno.dlopen(path, { mlxn_abi_version: { parameters: [], result: "u32" } });
  } catch (e) {
    throw dlopenError(path, e);
  }
  const version = probe.symbols.mlxn_abi_version();
  probe.close();
  if (version !== ABI_VERSION) {
    throw new MlxError(
      "AbiMismatch",
      `native library ${path} speaks ABI version ${version}, this module needs ${ABI_VERSION}: ` +
        `${remedy(path, "abi")}.`,
    );
  }
  let lib: Deno.DynamicLibrary<typeof symbols>;
  try {
    lib = Deno.dlopen(path, symbols);
  } catch (e) {
    throw new MlxError(
      "AbiMismatch",
      `native library ${path} reports ABI ${version} but lacks symbols this module needs ` +
        `(${e instanceof Error ? e.message : e}): ${remedy(path, "abi")}.`,
      { cause: e },
    );
  }
  const result = { path, symbols: lib.symbols };
  loaded.set(path, result);
  return result;
}
