/**
 * The README's quick start is the first code a user runs: it must work exactly as written, from a
 * directory outside the repository, with exactly the commands and permissions the README names, and
 * print what the README says it prints.
 */
import { equal, match, ok } from "node:assert/strict";

const root = new URL("../", import.meta.url);
const rootPath = root.pathname.replace(/\/$/, "");
const PLACEHOLDER = "/path/to/mlx-native";

/** The body of the first fenced block of `lang` after `heading`. */
function codeBlockAfter(markdown: string, heading: string, lang: string): string {
  const at = markdown.indexOf(heading);
  ok(at >= 0, `README has no "${heading}" section`);
  const fence = "```" + lang + "\n";
  const start = markdown.indexOf(fence, at);
  ok(start >= 0, `no \`\`\`${lang} block after "${heading}"`);
  const end = markdown.indexOf("```", start + fence.length);
  return markdown.slice(start + fence.length, end);
}

/** Runs `cmd` in `cwd` with the caller's environment minus every MLXN_* switch. */
async function runIn(cwd: string, cmd: string, args: string[]) {
  const env = Object.fromEntries(Object.entries(Deno.env.toObject()).filter(([k]) => !k.startsWith("MLXN_")));
  const out = await new Deno.Command(cmd, {
    args,
    cwd,
    env: { ...env, NO_COLOR: "1" },
    clearEnv: true,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

/** A temp directory outside the repository, set up with the quick start's shell step and script. */
async function quickStartDir(readme: string): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "mlxn-quickstart-" });
  ok(!dir.startsWith(rootPath), "the temp dir must be outside the repository");
  const setup = codeBlockAfter(readme, "## Quick start", "sh");
  ok(setup.includes(PLACEHOLDER), `the setup step names the checkout as ${PLACEHOLDER}`);
  const sh = await runIn(dir, "bash", ["-euc", setup.replaceAll(PLACEHOLDER, rootPath)]);
  equal(sh.code, 0, sh.stderr);
  await Deno.writeTextFile(`${dir}/script.ts`, codeBlockAfter(readme, "## Quick start", "ts"));
  return dir;
}

/** The `deno …` command the README gives after `phrase`, as arguments, the placeholder filled in. */
function commandAfter(readme: string, phrase: RegExp): string[] {
  const m = phrase.exec(readme);
  ok(m, `README has no ${phrase}`);
  return m[1]!.replaceAll(PLACEHOLDER, rootPath).replaceAll("'", "").split(/\s+/).slice(1);
}

function checkPrinted(stdout: string): void {
  // y = x · rmsNorm(x) with unit weights: x² / sqrt(mean(x²) + eps), mean(x²) = 7.5.
  const expected = [1, 2, 3, 4].map((v) => v * v / Math.sqrt(7.5 + 1e-6));
  const printed = [...stdout.matchAll(/^\s+(-?\d+\.\d+(?:e-?\d+)?),?$/gm)].map((m) => Number(m[1]));
  equal(printed.length, 8, stdout); // two passes of four values
  printed.forEach((v, i) =>
    ok(Math.abs(v - expected[i % 4]!) < 1e-5, `y[${i % 4}] = ${v}, expected ${expected[i % 4]}`)
  );
  equal([...stdout.matchAll(/fusions: 1,/g)].length, 2, stdout); // the README's comment promises one fusion
  equal([...stdout.matchAll(/barriers: \[ 0, 0 \]/g)].length, 2, stdout);
  equal([...stdout.matchAll(/dispatches: 1,/g)].length, 2, stdout);
  match(stdout, /planCache: "miss"[^]*planCache: "hit"/); // the second pass replays the cached plan
}

const readme = await Deno.readTextFile(new URL("README.md", root));

Deno.test("the README quick start runs as written from a directory outside the repository", async () => {
  const dir = await quickStartDir(readme);
  try {
    const args = commandAfter(readme, /Run it with `(deno run [^`]+)`/);
    const r = await runIn(dir, Deno.execPath(), args);
    equal(r.code, 0, r.stderr);
    checkPrinted(r.stdout);
    ok(!r.stderr.includes("mlx-native:"), `no notice expected with the README's grants:\n${r.stderr}`);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("the README's narrower grants run the quick start too, with one notice about MLXN_*", async () => {
  const dir = await quickStartDir(readme);
  try {
    const m = /Narrower grants work too: `(--allow-ffi=[^`]+)`/.exec(readme);
    ok(m, "README names a library-scoped --allow-ffi");
    const ffi = m[1]!.replaceAll(PLACEHOLDER, rootPath);
    const r = await runIn(dir, Deno.execPath(), ["run", ffi, "script.ts"]);
    equal(r.code, 0, r.stderr);
    checkPrinted(r.stdout);
    equal(r.stderr.match(/MLXN_\* environment switches cannot be read/g)?.length, 1, r.stderr);
    const env = await runIn(dir, Deno.execPath(), ["run", ffi, "--allow-env=MLXN_*", "script.ts"]);
    equal(env.code, 0, env.stderr);
    equal(env.stderr, "");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
