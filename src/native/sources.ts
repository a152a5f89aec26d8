/**
 * The native libraries' sources, compiler flags and the build entry's output folder, shared by the
 * build entry (build.ts), the loader (which looks there) and tests/build_test.ts (which checks them
 * against the Makefile and the tree).
 *
 * @module
 */

/** The package version (deno.json's); the build entry's output folder is per version. */
export const PACKAGE_VERSION = "0.1.0";

/**
 * The build entry's default output folder: `$XDG_CACHE_HOME/mlx-native/<version>`, else
 * `$HOME/.cache/mlx-native/<version>`, or undefined when neither variable can be read. `readEnv`
 * returns undefined for a variable that is unset or not readable.
 */
export function buildOutputDir(readEnv: (name: string) => string | undefined): string | undefined {
  const xdg = readEnv("XDG_CACHE_HOME"), home = readEnv("HOME");
  const base = xdg ? xdg : home ? `${home}/.cache` : undefined;
  return base === undefined ? undefined : `${base}/mlx-native/${PACKAGE_VERSION}`;
}

/** Sources of the CPU backend, relative to the package root (headers first). */
export const CPU_SOURCES: readonly string[] = [
  "native/mlxn.h",
  "native/core/internal.h",
  "native/core/backend.h",
  "native/core/tracker.h",
  "native/contracts/kernel_args.h",
  "native/contracts/contracts.gen.h",
  "native/contracts/contracts.h",
  "native/contracts/matmul.h",
  "native/contracts/quant_blocks.h",
  "native/contracts/sample.h",
  "kernels/cpu/cpu_kernel.h",
  "native/core/device.c",
  "native/core/key_compare.c",
  "native/core/queue.c",
  "native/core/stream.c",
  "native/contracts/attention.c",
  "native/contracts/contracts.gen.c",
  "native/contracts/elementwise.c",
  "native/contracts/kernel_args.c",
  "native/contracts/matmul.c",
  "native/contracts/norm.c",
  "native/contracts/rope.c",
  "native/contracts/sample.c",
  "native/cpu/backend.c",
  "kernels/cpu/attention.c",
  "kernels/cpu/elementwise.c",
  "kernels/cpu/matmul.c",
  "kernels/cpu/norm.c",
  "kernels/cpu/rope.c",
  "kernels/cpu/sample.c",
  "kernels/cpu/table.gen.c",
];

/** C flags of the CPU backend (the Makefile's CFLAGS_COMMON). */
export const CPU_CFLAGS: readonly string[] = [
  "-std=c11",
  "-O2",
  "-fPIC",
  "-pthread",
  "-Wall",
  "-Wextra",
  "-Wno-unused-parameter",
  "-ffp-contract=off",
  "-fvisibility=hidden",
  "-D_POSIX_C_SOURCE=200809L",
];

/** Sources of the Metal backend (macOS), relative to the package root, besides the core's. */
export const METAL_OBJC_SOURCE = "objc/mlxn_metal.m";

/**
 * The MSL sources embedded in the Metal library, in the Makefile's order (common.metal first, then
 * the rest sorted by name).
 */
export const METAL_SHADERS: readonly string[] = [
  "kernels/metal/common.metal",
  "kernels/metal/_params.gen.metal",
  "kernels/metal/attention.metal",
  "kernels/metal/elementwise.metal",
  "kernels/metal/matmul.metal",
  "kernels/metal/norm.metal",
  "kernels/metal/rope.metal",
  "kernels/metal/sample.metal",
];

/**
 * The header that embeds the MSL sources as one C string literal `mlxn_metal_source` (what the
 * Makefile's build/mlxn_metal_source.h rule writes): every line escaped and ended with `\n`.
 */
export function metalSourceHeader(shaders: readonly string[]): string {
  const lines = shaders.flatMap((text) => text.endsWith("\n") ? text.slice(0, -1).split("\n") : text.split("\n"));
  const quoted = lines.map((l) => `"${l.replaceAll("\\", "\\\\").replaceAll('"', '\\"')}\\n"\n`);
  return `static const char mlxn_metal_source[] =\n${quoted.join("")};\n`;
}

/** Where {@link metalCompileArgs} finds and puts things. */
export interface MetalBuildPaths {
  /** The folder holding the package sources at their relative paths. */
  src: string;
  /** The folder holding the generated mlxn_metal_source.h. */
  include: string;
  /** The library to write. */
  lib: string;
}

/**
 * The clang arguments that build the Metal library (the Makefile's recipe): the Objective-C backend
 * and the core's C sources, MRC, linked against Metal and Foundation.
 */
export function metalCompileArgs(paths: MetalBuildPaths): string[] {
  const core = CPU_SOURCES.filter((f) =>
    f.endsWith(".c") && !f.startsWith("native/cpu/") && !f.startsWith("kernels/cpu/")
  );
  return [
    ...CPU_CFLAGS,
    "-D_DARWIN_C_SOURCE",
    "-fno-objc-arc",
    `-I${paths.include}`,
    "-dynamiclib",
    "-framework",
    "Metal",
    "-framework",
    "Foundation",
    "-o",
    paths.lib,
    `${paths.src}/${METAL_OBJC_SOURCE}`,
    ...core.map((f) => `${paths.src}/${f}`),
  ];
}
