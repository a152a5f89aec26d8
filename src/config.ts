/**
 * Switches: environment variables read once, and only when the env permission is already granted
 * (no prompt, no NotCapable error); explicit options always win.
 *
 * @module
 */

/** A backend name. */
export type BackendName = "metal" | "cuda" | "cpu" | "metal-emu";

/** Every switch of the module, resolved. */
export interface MlxConfig {
  /** MLXN_BACKEND: the backend to open; undefined = best available. */
  backend?: BackendName;
  /** MLXN_LIB: explicit native library path. */
  lib?: string;
  /** MLXN_CONCURRENCY=0 turns concurrent dispatch off (implicit barrier after every dispatch). */
  concurrency: boolean;
  /** MLXN_FUSION=0 turns the fusion pass off. */
  fusion: boolean;
  /** MLXN_REORDER=0 turns the reorder pass off. */
  reorder: boolean;
  /** MLXN_VALIDATE=1 turns the hazard validator on. */
  validate: boolean;
  /** MLXN_PROFILE=cb|dispatch. */
  profile?: "cb" | "dispatch";
  /** MLXN_TRACE=file.json: write a Chrome trace. */
  trace?: string;
  /** MLXN_CUDA_GRAPHS=0: plain stream launches on the CUDA backend. */
  cudaGraphs: boolean;
  /** MLXN_CUDA_PDL=0: CUDA graph edges wait for full completion (no programmatic dependent launch). */
  cudaPdl: boolean;
}

const NAMES = [
  "MLXN_BACKEND",
  "MLXN_LIB",
  "MLXN_CONCURRENCY",
  "MLXN_FUSION",
  "MLXN_REORDER",
  "MLXN_VALIDATE",
  "MLXN_PROFILE",
  "MLXN_TRACE",
  "MLXN_CUDA_GRAPHS",
  "MLXN_CUDA_PDL",
] as const;

/** Reads one environment variable if, and only if, reading it is already permitted. */
export function readEnvIfGranted(name: string): string | undefined {
  try {
    if (Deno.permissions.querySync({ name: "env", variable: name }).state !== "granted") {
      return undefined;
    }
    return Deno.env.get(name);
  } catch {
    return undefined;
  }
}

let cached: Readonly<MlxConfig> | undefined;

/** The switches from the environment, read once per process. */
export function envConfig(): Readonly<MlxConfig> {
  if (cached) return cached;
  const env: Partial<Record<typeof NAMES[number], string>> = {};
  for (const n of NAMES) env[n] = readEnvIfGranted(n);
  const backend = env.MLXN_BACKEND?.toLowerCase();
  const profile = env.MLXN_PROFILE?.toLowerCase();
  cached = Object.freeze({
    backend: backend === "metal" || backend === "cuda" || backend === "cpu" || backend === "metal-emu"
      ? backend
      : undefined,
    lib: env.MLXN_LIB || undefined,
    concurrency: env.MLXN_CONCURRENCY !== "0",
    fusion: env.MLXN_FUSION !== "0",
    reorder: env.MLXN_REORDER !== "0",
    validate: env.MLXN_VALIDATE === "1",
    profile: profile === "cb" || profile === "dispatch" ? profile : undefined,
    trace: env.MLXN_TRACE || undefined,
    cudaGraphs: env.MLXN_CUDA_GRAPHS !== "0",
    cudaPdl: env.MLXN_CUDA_PDL !== "0",
  });
  return cached;
}
