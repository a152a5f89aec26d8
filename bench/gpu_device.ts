/**
 * The GPU benches' device: opened only when a GPU backend is available. Without one, the bench is
 * registered as ignored (so `deno bench bench/` on a CPU-only machine reports it skipped instead of
 * failing or running GPU-sized work on the CPU), and the reason goes to stderr.
 *
 * @module
 */
import { type BackendName, MlxDevice, MlxError } from "../mod.ts";

/**
 * Opens `backend` (or the best available backend when it is a GPU), or returns undefined after
 * registering an ignored bench named `name` and saying why on stderr.
 */
export function openGpuOrSkip(name: string, backend?: Exclude<BackendName, "cpu">): MlxDevice | undefined {
  let reason: string;
  try {
    const device = MlxDevice.open(backend ? { backend } : {});
    if (device.info.backend !== "cpu") return device;
    device.close();
    reason = "the best available backend is the CPU";
  } catch (e) {
    if (!(e instanceof MlxError)) throw e;
    reason = e.message;
  }
  console.error(`${name}: skipped, it needs a GPU backend (${reason})`);
  Deno.bench({ name: `${name} (skipped: needs a GPU backend)`, ignore: true, fn() {} });
  return undefined;
}
