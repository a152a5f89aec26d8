/**
 * Importing the module from a remote URL, as a user of the published package does (served here
 * from the repository over a local HTTP server): the library is found in the build entry's output
 * folder without a libPath, and every error names the build command that fits the backend.
 */
import { deepStrictEqual, equal, match, ok } from "node:assert/strict";
import { defaultLibraryPath, libraryFileName } from "../src/native/loader.ts";
import { PACKAGE_VERSION } from "../src/native/sources.ts";

const fixture = (name: string) => new URL(`./fixtures/${name}`, import.meta.url).pathname;

interface Outcome {
  ok: boolean;
  code?: string;
  message?: string;
  path?: string;
  result?: number[];
}

Deno.test("a remote import finds the build entry's library and names the right build commands", async () => {
  const server = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--quiet",
      "--allow-net=127.0.0.1",
      `--allow-read=${new URL("../", import.meta.url).pathname}`,
      fixture("file_server.ts"),
    ],
    stdin: "null",
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const tmp = await Deno.makeTempDir({ prefix: "mlxn-remote-" });
  try {
    const reader = server.stdout.getReader();
    const { value } = await reader.read();
    reader.releaseLock();
    const port = Number(new TextDecoder().decode(value).trim());
    ok(port > 0, "the file server printed no port");
    const base = `http://127.0.0.1:${port}`;
    const probe = async (flags: string[], env: Record<string, string> = {}): Promise<Outcome> => {
      const out = await new Deno.Command(Deno.execPath(), {
        args: [
          "run",
          "--quiet",
          "--no-prompt",
          "--no-config", // the repository's lockfile would record the served URLs
          "--no-lock",
          `--allow-import=127.0.0.1:${port}`,
          ...flags,
          fixture("remote_probe.ts"),
          `${base}/mod.ts`,
        ],
        env: { PATH: Deno.env.get("PATH") ?? "", HOME: `${tmp}/home`, DENO_DIR: `${tmp}/deno`, NO_COLOR: "1", ...env },
        clearEnv: true,
        stdin: "null",
        stdout: "piped",
        stderr: "piped",
      }).output();
      const text = new TextDecoder().decode(out.stdout).trim();
      ok(out.success && text, `probe failed: ${new TextDecoder().decode(out.stderr)}`);
      return JSON.parse(text.split("\n").pop()!);
    };
    const entry = `deno run -A ${base}/build.ts`;

    // No env grant: the output folder cannot be located; the error says which grant finds it.
    const blind = await probe(["--allow-ffi"]);
    equal(blind.code, "LibraryNotFound");
    match(blind.message!, /--allow-env=HOME,XDG_CACHE_HOME/);
    ok(blind.message!.includes(entry), blind.message);

    // Located but not built yet: the build entry's exact command.
    const missing = await probe(["--allow-ffi", "--allow-env"]);
    equal(missing.code, "LibraryNotFound");
    ok(missing.message!.includes(entry), missing.message);
    ok(!missing.message!.includes("make native"), missing.message);

    // CUDA asked for: the build entry cannot build it; the message says `make cuda`.
    const cuda = await probe(["--allow-ffi", "--allow-env"], { MLXN_BACKEND: "cuda" });
    equal(cuda.code, "LibraryNotFound");
    match(cuda.message!, /make cuda/);
    ok(!cuda.message!.includes(entry), cuda.message);

    // Built (the build entry's output, copied from this checkout's build): found without libPath.
    const out = `${tmp}/home/.cache/mlx-native/${PACKAGE_VERSION}`;
    await Deno.mkdir(out, { recursive: true });
    await Deno.copyFile(defaultLibraryPath("cpu"), `${out}/${libraryFileName("cpu")}`);
    const found = await probe(["--allow-ffi", "--allow-env"]);
    equal(found.ok, true, found.message);
    equal(found.path, `${out}/${libraryFileName("cpu")}`);
    deepStrictEqual(found.result, [1, 2]);
  } finally {
    server.kill();
    await server.status;
    await Deno.remove(tmp, { recursive: true });
  }
});
