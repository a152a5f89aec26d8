/**
 * Fails (exit 1) when the modules under a folder (default `src/`) import each other in a cycle,
 * type-only imports included: a cycle makes module initialisation order-dependent and keeps layers
 * from being read, tested or replaced alone. The module graph is Deno's own (`deno info --json`),
 * so every import form Deno resolves is seen.
 *
 * Usage: deno run --allow-run --allow-read scripts/check_cycles.ts [folder]
 *
 * @module
 */

interface InfoDependency {
  readonly code?: { readonly specifier?: string };
  readonly type?: { readonly specifier?: string };
}

interface InfoModule {
  readonly specifier: string;
  readonly dependencies?: readonly InfoDependency[];
}

/** The local imports of every module reachable from `root`, by file URL. */
async function moduleGraph(root: string): Promise<Map<string, Set<string>>> {
  const out = await new Deno.Command(Deno.execPath(), { args: ["info", "--json", root], stderr: "inherit" }).output();
  if (!out.success) throw new Error(`deno info ${root} failed`);
  const info = JSON.parse(new TextDecoder().decode(out.stdout)) as { modules: readonly InfoModule[] };
  const graph = new Map<string, Set<string>>();
  for (const m of info.modules) {
    const deps = new Set<string>();
    for (const d of m.dependencies ?? []) {
      for (const s of [d.code?.specifier, d.type?.specifier]) if (s !== undefined) deps.add(s);
    }
    graph.set(m.specifier, deps);
  }
  return graph;
}

async function* tsFiles(dir: string): AsyncGenerator<string> {
  for await (const e of Deno.readDir(dir)) {
    const path = `${dir}/${e.name}`;
    if (e.isDirectory) yield* tsFiles(path);
    else if (e.isFile && e.name.endsWith(".ts")) yield path;
  }
}

/** Strongly connected components with more than one module, or a module importing itself (Tarjan). */
export function cycles(graph: ReadonlyMap<string, ReadonlySet<string>>): string[][] {
  const index = new Map<string, number>(), low = new Map<string, number>();
  const stack: string[] = [], onStack = new Set<string>(), found: string[][] = [];
  let next = 0;
  const visit = (v: string): void => {
    index.set(v, next);
    low.set(v, next++);
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!graph.has(w)) continue;
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, index.get(w)!));
    }
    if (low.get(v) !== index.get(v)) return;
    const scc: string[] = [];
    let w: string;
    do {
      w = stack.pop()!;
      onStack.delete(w);
      scc.push(w);
    } while (w !== v);
    if (scc.length > 1 || graph.get(v)?.has(v)) found.push(scc.sort());
  };
  for (const v of graph.keys()) if (!index.has(v)) visit(v);
  return found;
}

/** One shortest import path from `from` back to itself inside `members`, for the message. */
function cyclePath(graph: ReadonlyMap<string, ReadonlySet<string>>, members: readonly string[]): string[] {
  const inScc = new Set(members), start = members[0]!;
  const parent = new Map<string, string>([[start, start]]);
  const queue = [start];
  for (let i = 0; i < queue.length; i++) {
    const v = queue[i]!;
    for (const w of graph.get(v) ?? []) {
      if (w === start) {
        const path = [start];
        for (let u = v; u !== start; u = parent.get(u)!) path.splice(1, 0, u);
        return [...path, start];
      }
      if (inScc.has(w) && !parent.has(w)) {
        parent.set(w, v);
        queue.push(w);
      }
    }
  }
  return [...members];
}

if (import.meta.main) {
  const folder = (Deno.args[0] ?? "src").replace(/\/$/, "");
  const base = new URL(`${folder}/`, `file://${Deno.cwd()}/`).href;
  const files: string[] = [];
  for await (const f of tsFiles(folder)) files.push(new URL(f, `file://${Deno.cwd()}/`).href);
  // One `deno info` per module not yet reached from an earlier root (usually one call in all).
  const graph = new Map<string, Set<string>>();
  for (const f of files.sort()) {
    if (graph.has(f)) continue;
    for (const [k, v] of await moduleGraph(f)) graph.set(k, v);
  }
  const local = new Map<string, Set<string>>();
  for (const [k, v] of graph) {
    if (k.startsWith(base)) local.set(k, new Set([...v].filter((d) => d.startsWith(base))));
  }
  const found = cycles(local);
  const rel = (u: string) => folder + "/" + u.slice(base.length);
  if (found.length === 0) {
    console.log(`check_cycles: no import cycle among ${local.size} modules under ${folder}/`);
  } else {
    console.error(`check_cycles: ${found.length} import cycle(s) under ${folder}/ (type-only imports count):`);
    for (const scc of found) {
      console.error(`  ${cyclePath(local, scc).map(rel).join(" → ")}`);
      if (scc.length > 2) console.error(`    (the cycle's modules: ${scc.map(rel).join(", ")})`);
    }
    console.error("Break each cycle: move the shared types or code into a module both sides import.");
    Deno.exit(1);
  }
}
