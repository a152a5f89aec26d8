/**
 * deno.json's permission sets: `deno test -P` and `deno bench -P` get every permission the suite
 * and the benches need, and `deno task demo` passes its flags through to the demo.
 */
import { equal, match } from "node:assert/strict";

const root = new URL("../", import.meta.url).pathname;
const suite = new URL("./fixtures/permission_suite.ts", import.meta.url).pathname;

async function deno(args: string[]) {
  const env = Object.fromEntries(Object.entries(Deno.env.toObject()).filter(([k]) => !k.startsWith("MLXN_")));
  const out = await new Deno.Command(Deno.execPath(), {
    args,
    cwd: root,
    env: { ...env, NO_COLOR: "1" },
    clearEnv: true,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

Deno.test("`deno test -P` runs with the test permission set from deno.json", async () => {
  const r = await deno(["test", "-P", "--no-prompt", "--no-check", suite]);
  equal(r.code, 0, r.stdout + r.stderr);
  match(r.stdout, /1 passed \| 0 failed/);
});

Deno.test("`deno test` without -P points at -P instead of failing test by test", async () => {
  const r = await deno(["test", "--no-prompt", "--no-check", suite]);
  equal(r.code === 0, false);
  match(r.stderr, /Test permissions were found in the config file.*-P/);
});

Deno.test("`deno bench -P` runs with the bench permission set from deno.json", async () => {
  const r = await deno(["bench", "-P", "--no-prompt", "--no-check", suite, "--", "bench"]);
  equal(r.code, 0, r.stdout + r.stderr);
  match(r.stdout, /open a device and read a buffer/);
});

Deno.test("`deno task demo` passes flags through to the demo", async () => {
  const r = await deno(["task", "demo", "--layers", "1", "--tokens", "2", "--modes", "direct/hand"]);
  equal(r.code, 0, r.stdout + r.stderr);
  match(r.stdout, /model: 1 layers,/);
  match(r.stdout, /; 2 tokens per mode/);
});
