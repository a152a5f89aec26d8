/**
 * The native conflict tracker's interval sets (native/core/tracker.h) against a byte map
 * (tests/native/tracker_check.c), built with blocks of 2, 3 and 8 intervals, so that groups of a few
 * hundred slices split blocks and merge across them, and with the library's own block size; once
 * more under AddressSanitizer and UndefinedBehaviorSanitizer where the compiler has them. Each run
 * also covers ranges ending at UINT64_MAX, the group serial's wrap and a failure of every allocation
 * the tracker makes (reported, sets whole, the reset tracker exact again; no leak under ASan). The
 * library's build is checked through FFI by tests/review_native_auto_test.ts and
 * tests/native_auto_barriers_test.ts.
 */
import { ok } from "node:assert/strict";
import { hostCompiler } from "./helpers.ts";

const SOURCE = new URL("./native/tracker_check.c", import.meta.url).pathname;

/** Builds the check with `flags`, runs it and returns its output; null when the build is refused. */
async function buildAndRun(flags: string[], mayRefuse = false): Promise<string | null> {
  const dir = await Deno.makeTempDir();
  try {
    const exe = `${dir}/tracker_check`;
    const build = await new Deno.Command(hostCompiler(), {
      args: ["-std=c11", "-O2", ...flags, "-o", exe, SOURCE],
      stdout: "piped",
      stderr: "piped",
    }).output();
    if (!build.success && mayRefuse) return null;
    ok(build.success, new TextDecoder().decode(build.stderr));
    // A clean environment: under `make sanitize-test` this process preloads an ASan runtime that a
    // sanitized child must not inherit.
    const run = await new Deno.Command(exe, { clearEnv: true, stdout: "piped", stderr: "piped" }).output();
    const out = new TextDecoder().decode(run.stdout) + new TextDecoder().decode(run.stderr);
    ok(run.success, out);
    return out.trim();
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

const OK = /^tracker: ok \d{5,} accesses, [1-9]\d* allocation failures$/;

for (const block of ["2", "3", "8", "the library's"]) {
  Deno.test(`tracker interval sets with blocks of ${block} intervals agree with a byte map`, async () => {
    const out = await buildAndRun(block === "the library's" ? [] : [`-DTRK_BLOCK=${block}u`]);
    ok(OK.test(out!), out!);
  });
}

Deno.test("tracker interval sets under ASan and UBSan (blocks of 2)", async () => {
  const sanitize = ["-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"];
  const out = await buildAndRun(["-DTRK_BLOCK=2u", ...sanitize], true);
  if (out === null) return; // this compiler cannot build with the sanitizers: the plain builds above still ran
  ok(OK.test(out), out);
});
