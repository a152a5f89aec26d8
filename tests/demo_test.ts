/**
 * The decode demo's command line as a new user meets it: --help, a wrong flag, the README's flag
 * list, and a result that fits an 80-column terminal and says what its modes and rows mean.
 */
import { deepStrictEqual, equal, match, ok } from "node:assert/strict";
import { runDeno } from "./helpers.ts";

const demo = new URL("../examples/decode.ts", import.meta.url).pathname;
const flags = ["run", "--no-prompt", "--allow-ffi", "--allow-read", "--allow-env"];
const noStack = (text: string) => ok(!/^\s+at /m.test(text), `a stack trace was printed:\n${text}`);

/** The long flags a text names (`--name`), sorted and deduplicated. */
const flagNames = (text: string) => [...new Set(text.match(/--[a-z][a-z-]*/g) ?? [])].sort();

Deno.test("--help prints the usage and exits 0", async () => {
  const r = await runDeno([...flags, demo, "--help"]);
  equal(r.code, 0, r.stderr);
  match(r.stdout, /^Usage: deno run .*examples\/decode\.ts \[flags\]/);
  noStack(r.stdout + r.stderr);
});

Deno.test("an unknown flag or a bad value is a one-line error and the usage, exit 2", async () => {
  for (
    const args of [["--bogus"], ["--tokens"], ["--quant", "q5"], ["--modes", "direct/handy"], ["--backend", "tpu"]]
  ) {
    const r = await runDeno([...flags, demo, ...args]);
    equal(r.code, 2, `${args}: ${r.stderr}`);
    match(r.stderr, /^decode: .+\n\nUsage: /, args.join(" "));
    noStack(r.stderr);
  }
  match((await runDeno([...flags, demo, "--bogus"])).stderr, /'--bogus'/);
});

Deno.test("the README lists every flag the demo takes, and no other", async () => {
  const help = (await runDeno([...flags, demo, "--help"])).stdout;
  const readme = await Deno.readTextFile(new URL("../README.md", import.meta.url));
  const at = readme.indexOf("The demo takes flags");
  ok(at >= 0, "README has no demo flag list");
  const list = readme.slice(at, readme.indexOf(".\n", readme.indexOf("--trace", at)));
  const readmeFlags = flagNames(list).filter((f) => f !== "--help");
  deepStrictEqual(
    readmeFlags,
    flagNames(help).filter((f) =>
      !["--help", "--allow-ffi", "--allow-read", "--allow-env", "--allow-write"].includes(f)
    ),
  );
  for (const q of ["q4_0", "mlx4", "bf16"]) ok(list.includes(q), `README's --quant misses ${q}`);
});

Deno.test("the result fits 80 columns and explains every mode and row", async () => {
  const r = await runDeno([...flags, demo, "--layers", "1", "--tokens", "2", "--warmup", "1"]);
  equal(r.code, 0, r.stderr);
  const out = r.stdout.slice(r.stdout.indexOf("per token"));
  for (const line of out.split("\n")) ok(line.length <= 80, `${line.length} columns: ${line}`);
  const [tablePart, legend] = out.split("\nmodes:\n");
  ok(legend, out);
  const header = tablePart!.split("\n")[1]!.trim().split(/\s+/);
  deepStrictEqual(header, ["direct/hand", "direct/auto", "recorded/opt"]);
  for (const mode of header) match(legend, new RegExp(`^  ${mode}\\s+\\S`, "m"));
  const rowLabels = tablePart!.split("\n").slice(2).filter((l) => l.trim()).map((l) => l.replace(/(\s+\S+){3}$/, ""));
  ok(rowLabels.length >= 10, tablePart);
  const rowsLegend = legend.slice(legend.indexOf("rows:"));
  for (const label of rowLabels) ok(rowsLegend.includes(`  ${label.trim()}  `), `row "${label}" is not explained`);
  match(r.stdout, /ok: the modes produce identical logits and tokens/);
});
