/**
 * Finds, permission-checks and loads a backend's native library. The only module that calls
 * `Deno.dlopen`.
 *
 * Discovery order: an explicit path > MLXN_LIB (read only when the env permission is already
 * granted) > the module's own build/ directory. The ffi permission is queried first, so a missing
 * grant is a clear PermissionDenied naming the flag — never a prompt, never "library not found".
 *
 * @module
 */

import type { BackendName } from "../config.ts";
import { MlxError } from "../errors.ts";
import { ABI_VERSION } from "./abi.ts";
import { type NativeSymbols, symbols } from "./ffi.ts";

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
export function moduleBuildDir(): string | undefined {
  const url = new URL("../../build/", import.meta.url);
  if (url.protocol !== "file:") return undefined;
  let path = decodeURIComponent(url.pathname);
  if (Deno.build.os === "windows") path = path.replace(/^\/([A-Za-z]:)/, "$1");
  return path.replace(/\/$/, "");
}

/** The default library path of a backend, or undefined when the module is not local. */
export function defaultLibraryPath(backend: BackendName): string | undefined {
  const dir = moduleBuildDir();
  return dir ? `${dir}/${libraryFileName(backend)}` : undefined;
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

function dlopenError(path: string, e: unknown): MlxError {
  const msg = e instanceof Error ? e.message : String(e);
  if (/no such file|not found|cannot find|image not found/i.test(msg)) {
    return new MlxError(
      "LibraryNotFound",
      `native library ${path} does not exist: build it with \`make native\` in the mlx-native ` +
        `checkout (or run the package's build entry and pass the libPath it prints). (${msg})`,
      { cause: e },
    );
  }
  return new MlxError(
    "LibraryLoadFailed",
    `native library ${path} exists but could not be loaded (${msg}): rebuild it with \`make native\` ` +
      `for this OS and architecture, and check that the file is readable.`,
    { cause: e },
  );
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
        `rebuild the library from the same release (\`make native\`).`,
    );
  }
  let lib: Deno.DynamicLibrary<typeof symbols>;
  try {
    lib = Deno.dlopen(path, symbols);
  } catch (e) {
    throw new MlxError(
      "AbiMismatch",
      `native library ${path} reports ABI ${version} but lacks symbols this module needs ` +
        `(${e instanceof Error ? e.message : e}): rebuild it with \`make native\`.`,
      { cause: e },
    );
  }
  const result = { path, symbols: lib.symbols };
  loaded.set(path, result);
  return result;
}
