/**
 * The README's quick start is the first code a user runs: it must work exactly as written, with
 * exactly the permission the README names, and print what the README says it prints.
 */
import { equal, match, ok } from "node:assert/strict";
import { defaultLibraryPath } from "../src/native/loader.ts";
import { runDeno } from "./helpers.ts";

const root = new URL("../", import.meta.url);

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

Deno.test("the README quick start runs as written with a library-scoped --allow-ffi", async () => {
  const readme = await Deno.readTextFile(new URL("README.md", root));
  const code = codeBlockAfter(readme, "## Quick start", "ts");
  match(readme, /deno run --allow-ffi=\.\/build\/libmlxn_cpu\.so script\.ts/);
  const dir = await Deno.makeTempDir();
  try {
    const script = `${dir}/script.ts`;
    await Deno.writeTextFile(script, code.replaceAll('"./mod.ts"', JSON.stringify(new URL("mod.ts", root).href)));
    const lib = defaultLibraryPath("cpu")!;
    const r = await runDeno(["run", "--no-prompt", "--quiet", `--allow-ffi=${lib}`, script]);
    equal(r.code, 0, r.stderr);
    // y = x · rmsNorm(x) with unit weights: x² / sqrt(mean(x²) + eps), mean(x²) = 7.5.
    const expected = [1, 2, 3, 4].map((v) => v * v / Math.sqrt(7.5 + 1e-6));
    const printed = [...r.stdout.matchAll(/^\s+(-?\d+\.\d+(?:e-?\d+)?),?$/gm)].map((m) => Number(m[1]));
    equal(printed.length, 4, r.stdout);
    printed.forEach((v, i) => ok(Math.abs(v - expected[i]) < 1e-5, `y[${i}] = ${v}, expected ${expected[i]}`));
    match(r.stdout, /fusions: 1,/); // the README's comment promises one fusion
    match(r.stdout, /barriers: \[ 0, 0 \]/);
    match(r.stdout, /dispatches: 1,/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
