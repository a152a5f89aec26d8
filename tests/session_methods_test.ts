/** The session's op methods: one compiled function per op, every argument forwarded, with and without code generation. */
import { deepStrictEqual, equal, match, ok } from "node:assert/strict";
import { GraphExecutor, GraphSession, SESSION_OPS } from "../mod.ts";
import { runDeno, testContext } from "./helpers.ts";

Deno.test("each session op method is a function of its own, named after its op (separate call feedback per op)", () => {
  using ctx = testContext();
  const exec = new GraphExecutor(ctx.device);
  using s = exec.begin();
  const names = Object.keys(SESSION_OPS);
  const methods = names.map((name) => Reflect.get(GraphSession.prototype, name) as (...a: unknown[]) => void);
  // One function literal shared by every op would give every method the same source text.
  equal(new Set(methods.map(String)).size, names.length, "one source text per op");
  methods.forEach((m, i) => {
    equal(m.name, names[i]);
    equal(m.length, 6, "the fixed parameters the methods always had");
    equal(Reflect.get(s, names[i]!), m, "the session uses the prototype's method");
  });
});

/** y = (x / rms(x)) · w · s + r for x = 1..8, w = 2, s = 3, r = 1. */
function expected(n: number): number[] {
  const x = Array.from({ length: n }, (_, i) => i + 1);
  const rms = Math.sqrt(x.reduce((a, v) => a + v * v, 0) / n);
  return x.map((v) => Math.fround(Math.fround(Math.fround(v / rms) * 2) * 3) + 1);
}

for (const codegen of [true, false]) {
  Deno.test(`session op methods forward every argument and refuse finished sessions (code generation ${codegen ? "allowed" : "disallowed"})`, async () => {
    const flags = codegen ? [] : ["--v8-flags=--disallow-code-generation-from-strings"];
    const probe = new URL("./fixtures/session_methods_probe.ts", import.meta.url).pathname;
    const r = await runDeno(["run", "--allow-ffi", "--allow-read", "--allow-env", ...flags, probe]);
    ok(r.success, r.stderr);
    const got = JSON.parse(r.stdout.trim().split("\n").pop()!);
    const want = expected(8);
    got.out.forEach((v: number, i: number) => ok(Math.abs(v - want[i]!) < 1e-4, `out[${i}] = ${v}, want ${want[i]}`));
    deepStrictEqual(got.sum, [...got.out.slice(0, 4).map((v: number) => v + 1), 0, 0, 0, 0]);
    match(got.refused, /^InvalidState: rmsNorm: .*already finished/);
    equal(got.distinctSources, codegen ? 3 : 1, codegen ? "compiled per op" : "the shared closure");
  });
}
