/**
 * Switches: environment variables read once, and only when the env permission is already granted
 * (no prompt, no NotCapable error); explicit options always win. Without the permission a switch's
 * value cannot be read, nor can whether it is set, so the first read says once on stderr that MLXN_*
 * switches are being ignored, unless the user denied them on purpose (`--deny-env`).
 *
 * @module
 */

/** A backend name. */
export type BackendName = "metal" | "cuda" | "cpu" | "metal-emu";

/** Every switch of the module, resolved. */
export interface MlxConfig {
  /** MLXN_BACKEND: the backend to open; undefined = best available. */
  backend?: BackendName | undefined;
  /** MLXN_LIB: explicit native library path. */
  lib?: string | undefined;
  /** MLXN_CONCURRENCY=0 turns concurrent dispatch off (implicit barrier after every dispatch). */
  concurrency: boolean;
  /** MLXN_FUSION=0 turns the fusion pass off. */
  fusion: boolean;
  /** MLXN_REORDER=0 turns the reorder pass off. */
  reorder: boolean;
  /** MLXN_VALIDATE=1 turns the hazard validator on. */
  validate: boolean;
  /** MLXN_PROFILE=cb|dispatch. */
  profile?: "cb" | "dispatch" | undefined;
  /** MLXN_TRACE=file.json: write a Chrome trace. */
  trace?: string | undefined;
  /** MLXN_CUDA_GRAPHS=0: plain stream launches on the CUDA backend. */
  cudaGraphs: boolean;
  /** MLXN_CUDA_PDL=0: CUDA graph edges wait for full completion (no programmatic dependent launch). */
  cudaPdl: boolean;
  /** MLXN_PLAN_CACHE=0: recorded passes are optimised afresh every time (no plan cache). */
  planCache: boolean;
}

/** The names of every switch, in the order the README lists them. */
export const SWITCH_NAMES: readonly string[] = [
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
  "MLXN_PLAN_CACHE",
];

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

/** The env permission state of a variable ("granted", "prompt" or "denied"); never prompts. */
function envPermission(name: string): Deno.PermissionState {
  try {
    return Deno.permissions.querySync({ name: "env", variable: name }).state;
  } catch {
    return "denied";
  }
}

/**
 * The notice for switches that cannot be read because env access was neither granted nor denied,
 * or undefined when every switch is readable or deliberately denied.
 */
export function unreadableSwitchesNotice(
  state: (name: string) => Deno.PermissionState = envPermission,
): string | undefined {
  const unread = SWITCH_NAMES.filter((n) => state(n) === "prompt");
  if (unread.length === 0) return undefined;
  const which = unread.length === SWITCH_NAMES.length ? "MLXN_* environment switches" : unread.join(", ");
  return `mlx-native: ${which} cannot be read without env permission, so any that are set are ignored ` +
    `(MLXN_LIB then loads the default library). To apply them run with --allow-env='MLXN_*' (or --allow-env); ` +
    `to silence this, pass the settings as options and run with --deny-env='MLXN_*'.`;
}

let cached: Readonly<MlxConfig> | undefined;

/**
 * The switches from the environment, read once per process. The first call prints
 * {@link unreadableSwitchesNotice} to stderr when it applies.
 */
export function envConfig(): Readonly<MlxConfig> {
  if (cached) return cached;
  const notice = unreadableSwitchesNotice();
  if (notice) console.error(notice);
  const env: Record<string, string | undefined> = {};
  for (const n of SWITCH_NAMES) env[n] = readEnvIfGranted(n);
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
    planCache: env.MLXN_PLAN_CACHE !== "0",
  });
  return cached;
}
