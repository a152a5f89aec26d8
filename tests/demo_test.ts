/**
 * The decode demo's command line as a new user meets it: --help, a wrong flag, the README's flag
 * list, a result that fits an 80-column terminal and says what its modes and rows mean, and every
 * encode mode under both token loops producing the same tokens.
 */
import { deepStrictEqual, equal, match, ok } from "node:assert/strict";
import { runDeno } from "./helpers.ts";

const demo = new URL("../examples/decode.ts", import.meta.url).pathname;
const flags = ["run", "--no-prompt", "--allow-ffi", "--allow-read", "--allow-env"];
const noStack = (text: string) => ok(!/^\s+at /m.test(text), `a stack trace was printed:\n${text}`);
const backend = Deno.env.get("MLXN_BACKEND");
const backendEnv = backend ? { MLXN_BACKEND: backend } : {};

/** One table of the demo's result: its column headers and, per row label, its cells. */
interface Table {
  header: string[];
  rows: Map<string, string[]>;
}

/** The result tables (one, or one per loop when the columns do not fit 80 characters). */
function tables(stdout: string): Table[] {
  const at = stdout.indexOf("per token");
  ok(at >= 0, stdout);
  const body = stdout.slice(stdout.indexOf("\n", at) + 1, stdout.indexOf("\nmodes:\n"));
  return body.split("\n\n").map((block) => {
    const [head, ...lines] = block.split("\n").filter((l) => l.trim());
    const header = head!.trim().split(/\s+/);
    const rows = new Map(lines.map((l) => {
      const words = l.trim().split(/\s+/);
      return [words.slice(0, -header.length).join(" "), words.slice(-header.length)] as const;
    }));
    return { header, rows };
  });
}

/** The long flags a text names (`--name`), sorted and deduplicated. */
const flagNames = (text: string) => [...new Set(text.match(/--[a-z][a-z-]*/g) ?? [])].sort();

Deno.test("--help prints the usage and exits 0", async () => {
  const r = await runDeno([...flags, demo, "--help"]);
  equal(r.code, 0, r.stderr);
  match(r.stdout, /^Usage: deno run .*examples\/decode\.ts \[flags\]/);
  match(r.stdout, /^ {2}--loop KIND +how the modes' token loop is driven \(default sync/m);
  for (const kind of ["sync", "pipelined", "both"]) match(r.stdout, new RegExp(`^ {20}${kind} +\\S`, "m"));
  noStack(r.stdout + r.stderr);
});

Deno.test("an unknown flag or a bad value is a one-line error and the usage, exit 2", async () => {
  for (
    const args of [
      ["--bogus"],
      ["--tokens"],
      ["--quant", "q5"],
      ["--modes", "direct/handy"],
      ["--backend", "tpu"],
      ["--loop"],
      ["--loop", "async"],
      ["--loop", "Both"],
      ["--loop", ""],
      ["--loop", "sync,pipelined"],
      ["--modes", "frozen,frozen"],
      ["--depth", "65000", "--read-batch", "1000"],
    ]
  ) {
    const r = await runDeno([...flags, demo, ...args]);
    equal(r.code, 2, `${args}: ${r.stderr}`);
    match(r.stderr, /^decode: .+\n\nUsage: /, args.join(" "));
    noStack(r.stderr);
  }
  match((await runDeno([...flags, demo, "--bogus"])).stderr, /'--bogus'/);
  match((await runDeno([...flags, demo, "--loop", "async"])).stderr, /^decode: loop must be sync, pipelined or both/);
  match((await runDeno([...flags, demo, "--modes", "pipelined,pipelined"])).stderr, /^decode: modes must not repeat/);
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

Deno.test("--loop both: every mode under the sync and the pipelined loop, all with the same tokens", async () => {
  const r = await runDeno([
    ...flags,
    demo,
    ...["--layers", "1", "--tokens", "4", "--warmup", "1", "--read-batch", "2", "--loop", "both"],
    ...["--modes", "direct/hand,direct/auto,recorded/opt,pipelined"],
  ], backendEnv);
  equal(r.code, 0, r.stderr + r.stdout);
  const out = r.stdout.slice(r.stdout.indexOf("per token"));
  for (const line of out.split("\n")) ok(line.length <= 80, `${line.length} columns: ${line}`);
  // Seven columns do not fit 80 characters: one table per loop, the sync one first.
  const [sync, piped, ...more] = tables(r.stdout);
  equal(more.length, 0, out);
  deepStrictEqual(sync!.header, ["direct/hand", "direct/auto", "recorded/opt"]);
  deepStrictEqual(sync!.rows.get("loop"), ["sync", "sync", "sync"]);
  deepStrictEqual(piped!.header, ["direct/hand", "direct/auto", "recorded/opt", "pipelined"]);
  deepStrictEqual(piped!.rows.get("loop"), ["pipelined", "pipelined", "pipelined", "pipelined"]);
  for (const t of [sync!, piped!]) {
    deepStrictEqual(t.rows.get("same tokens"), t.header.map(() => "yes"), out);
    deepStrictEqual(t.rows.get("max |Δ logits|"), t.header.map(() => "0"), out);
  }
  // recorded/opt splits each pass over two command buffers under either loop; the pipelined mode
  // keeps one. Both recorded columns of the pipelined loop replay their cached plan every token.
  deepStrictEqual(sync!.rows.get("cmd buffers"), ["1", "1", "2"]);
  deepStrictEqual(piped!.rows.get("cmd buffers"), ["1", "1", "2", "1"]);
  deepStrictEqual(piped!.rows.get("plan hits"), ["-", "-", "4/4", "4/4"]);
  // Each pipelined-loop column reports its overlap; the legend explains the loops and the loop row.
  for (const col of ["direct/hand, pipelined", "direct/auto, pipelined", "recorded/opt, pipelined", "pipelined"]) {
    match(r.stdout, new RegExp(`^${col}: depth 2, ids read every 2 tokens \\(2 reads\\);$`, "m"));
  }
  match(out, /^loops:\n {2}sync +\S.*\n {2}pipelined +DecodeLoop/m);
  match(out, /^ {2}loop +how the token loop is driven/m);
  match(r.stdout, /^ok: the modes produce identical logits and tokens$/m);
});

Deno.test("--loop pipelined runs direct modes in a DecodeLoop, each with its own host + device trace", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const r = await runDeno([
      ...flags,
      `--allow-write=${dir}`,
      demo,
      ...["--layers", "1", "--tokens", "3", "--read-batch", "2", "--loop", "pipelined"],
      ...["--modes", "direct/hand,direct/auto", "--trace", `${dir}/d.json`],
    ], backendEnv);
    equal(r.code, 0, r.stderr + r.stdout);
    const [t, ...more] = tables(r.stdout);
    equal(more.length, 0);
    deepStrictEqual(t!.header, ["direct/hand", "direct/auto"]);
    deepStrictEqual(t!.rows.get("loop"), ["pipelined", "pipelined"]);
    deepStrictEqual(t!.rows.get("same tokens"), ["yes", "yes"]);
    match(r.stdout, /^ok: the modes produce identical logits and tokens$/m);
    for (const mode of ["direct-hand", "direct-auto"]) {
      const events = JSON.parse(await Deno.readTextFile(`${dir}/d.${mode}.pipelined.json`)).traceEvents as {
        cat: string;
        name: string;
        ph: string;
        args?: { name?: string };
      }[];
      const named = (cat: string) => events.filter((e) => e.cat === cat).map((e) => e.name);
      deepStrictEqual(named("host encode"), ["encode 0", "encode 1", "encode 2"]);
      deepStrictEqual(named("command buffer"), ["step 0", "step 1", "step 2"]);
      deepStrictEqual(named("host readback"), ["read ids", "read ids"]);
      const process = events.find((e) => e.ph === "M" && e.name === "process_name")!.args!.name!;
      ok(process.startsWith(`${mode.replace("-", "/")}, pipelined: DecodeLoop (depth 2`), process);
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("the frozen mode encodes each run's first pass only and decodes the pipelined mode's tokens", async () => {
  const r = await runDeno([
    ...flags,
    demo,
    ...["--layers", "1", "--tokens", "4", "--warmup", "1", "--read-batch", "2", "--modes", "pipelined,frozen"],
  ], backendEnv);
  equal(r.code, 0, r.stderr + r.stdout);
  const [t, ...more] = tables(r.stdout);
  equal(more.length, 0);
  deepStrictEqual(t!.header, ["pipelined", "frozen"]);
  deepStrictEqual(t!.rows.get("loop"), ["pipelined", "pipelined"]);
  deepStrictEqual(t!.rows.get("same tokens"), ["yes", "yes"]);
  deepStrictEqual(t!.rows.get("max |Δ logits|"), ["0", "0"]);
  // The frozen run's first pass is optimised when it is frozen; the other three replay it.
  deepStrictEqual(t!.rows.get("plan hits"), ["4/4", "3/4"]);
  match(r.stdout, /^ {2}frozen +pipelined, frozen: encoded once per run/m);
});
