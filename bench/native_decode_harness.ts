/**
 * The native decoder's cost per dispatch, with and without automatic barriers. Nothing runs.
 *
 * - `slices`, `hazard`, `shuffled`, `gaps`: a prebuilt stream of N (env, default 800)
 *   elementwise_add_f32 dispatches (two whole-buffer inputs; the output a slice in order ("slices"),
 *   in shuffled order ("shuffled"), in shuffled order with a slice's room left free after each, so
 *   none touch ("gaps"), or one whole buffer ("hazard")) handed to `mlxn_cmdbuf_encode` of a fresh
 *   command buffer.
 * - `inplace`: the same with `out` also as the first input (out = out + y, the host path harness's
 *   hazard pass): each dispatch's first access already conflicts, and its read and write of `out`
 *   meet in one tracker entry.
 * - `step`: the stream of one decode step of examples/llama.ts (32 layers, small dims, bf16; 419
 *   dispatches of matmuls, norms, rope, attention, elementwise), captured from the encoder once with
 *   hand barriers ("off") and once with automatic barriers ("auto"), replayed the same way.
 *
 * - `like`: the decode step's stream at the next position (the position's constants and the KV-cache
 *   rows differ) handed to `mlxn_cmdbuf_replay_like` against a template of the step at position 5
 *   (`mlxn_cmdbuf_encode_template`): compared, copied and patched instead of decoded ("like-same":
 *   the template's own stream again, compared and copied).
 *
 * Best of 3,000 per case (REPS=n to change), cases interleaved round by round. DUMP=<dir> also writes
 * each case's stream with the buffers and pipelines it names (<dir>/<mode>-<off|auto>.bin), for
 * bench/decode_replay.c to replay without Deno (under perf or valgrind, or against another build).
 *
 *   ROOT=<tree> deno run -A bench/native_decode_harness.ts [slices,hazard,inplace,shuffled,gaps,step,like]   (AUTO=0: tracking off only)
 */
const root = (Deno.env.get("ROOT") ?? new URL("..", import.meta.url).pathname).replace(/\/$/, "");
const { DType, GraphExecutor, MlxDevice } = await import(`file://${root}/mod.ts`);
const { recordHeader, Op } = await import(`file://${root}/src/native/abi.ts`);
const device = MlxDevice.open({ backend: "cpu" });
const sym = device.sym;
// Every allocation's size and every pipeline's name, by handle, for DUMP.
const allocs = new Map<number, bigint>(), pipelines = new Map<number, string>();
{
  const alloc = sym.mlxn_buffer_alloc, get = sym.mlxn_pipeline_get;
  // deno-lint-ignore no-explicit-any
  const s = sym as any;
  s.mlxn_buffer_alloc = (d: unknown, n: bigint) => {
    const h = alloc(d, n);
    allocs.set(h, BigInt(n));
    return h;
  };
  s.mlxn_pipeline_get = (d: unknown, name: Uint8Array) => {
    const h = get(d, name);
    pipelines.set(h, new TextDecoder().decode(name.subarray(0, name.indexOf(0))));
    return h;
  };
}
const N = Number(Deno.env.get("N") ?? 800), E = 64;
const x = device.upload(new Float32Array(E)), y = device.upload(new Float32Array(E));
const wide = device.alloc(2 * N * E * 4, DType.F32); // room for "gaps"
const out = device.alloc(E * 4, DType.F32);
const add = device.kernels.get("elementwise_add_f32").handle;
let seed = 7;
const perm = Array.from({ length: N }, (_, i) => i).sort(() =>
  (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648 - 0.5
);
function stream(auto: boolean, mode: string): Uint8Array[] {
  const w: number[] = [];
  if (auto) w.push(recordHeader(Op.AUTO_BARRIERS, 1, 1));
  w.push(recordHeader(Op.SET_PIPELINE, 2), add);
  for (let i = 0; i < N; i++) {
    w.push(recordHeader(Op.SET_BUFFER_WHOLE, 2, 0), mode === "inplace" ? out.handle : x.handle);
    w.push(recordHeader(Op.SET_BUFFER_WHOLE, 2, 1), y.handle);
    if (mode === "hazard" || mode === "inplace") w.push(recordHeader(Op.SET_BUFFER_WHOLE, 2, 2), out.handle);
    else {
      const slot = mode === "shuffled" ? perm[i]! : mode === "gaps" ? 2 * perm[i]! : i;
      w.push(recordHeader(Op.SET_BUFFER, 4, 2), wide.handle, slot * E * 4, E * 4);
    }
    w.push(recordHeader(Op.SET_BYTES, 3, 3), 4, E);
    w.push(recordHeader(Op.DISPATCH_THREADS, 8), E, 1, 1, E, 1, 1, i);
  }
  return [new Uint8Array(Uint32Array.from(w).buffer)];
}

/** The chunks one decode step hands to mlxn_cmdbuf_encode, copied, and its dispatch count. */
async function stepChunks(auto: boolean, position = 5): Promise<{ chunks: Uint8Array[]; dispatches: number }> {
  const { createLlama } = await import(`file://${root}/examples/llama.ts`);
  const cfg = { layers: 32, hidden: 256, heads: 4, kvHeads: 2, ffn: 512, vocab: 512, ctx: 512 };
  const model = stepModel ??= createLlama(device, { ...cfg, quant: "bf16", seed: 1 });
  const exec = stepExec ??= new GraphExecutor(device);
  const chunks: Uint8Array[] = [];
  const encode = sym.mlxn_cmdbuf_encode;
  // deno-lint-ignore no-explicit-any
  (sym as any).mlxn_cmdbuf_encode = (cb: unknown, bytes: Uint8Array, n: number) => {
    chunks.push(bytes.slice(0, n));
    return encode(cb, bytes, n);
  };
  try {
    const s = exec.begin({ autoBarriers: auto });
    model.step(s, position, auto ? () => {} : () => s.barrier());
    s.encoder.flush();
    s.dispose();
  } finally {
    // deno-lint-ignore no-explicit-any
    (sym as any).mlxn_cmdbuf_encode = encode;
  }
  let dispatches = 0;
  for (const c of chunks) {
    const w = new Uint32Array(c.buffer, c.byteOffset, c.byteLength / 4);
    for (let i = 0; i < w.length; i += w[i]! >>> 16) {
      const op = w[i]! & 0xff;
      if (op === Op.DISPATCH_THREADS || op === Op.DISPATCH_GROUPS) dispatches++;
    }
  }
  return { chunks, dispatches };
}
// deno-lint-ignore no-explicit-any
let stepModel: any, stepExec: any;

// deno-lint-ignore no-explicit-any
const dev = (device as any).devicePtr();
const reps = Number(Deno.env.get("REPS") ?? 3000);
/** A case: chunks decoded into a fresh command buffer, or (with `template`) one replayed like it. */
const cases: { name: string; chunks: Uint8Array[]; n: number; best: number; template?: Deno.PointerObject }[] = [];
for (const mode of (Deno.args[0] ?? "slices,hazard,inplace,shuffled,step,like").split(",")) {
  for (const auto of (Deno.env.get("AUTO") === "0" ? [false] : [false, true])) {
    const name = `${mode} ${auto ? "auto" : "off "}`;
    if (mode === "like") {
      const base = await stepChunks(auto), next = await stepChunks(auto, 6);
      if (base.chunks.length !== 1 || next.chunks.length !== 1) throw new Error("a step fits one chunk");
      const template = sym.mlxn_cmdbuf_new(dev)!, b = base.chunks[0]!;
      if (sym.mlxn_cmdbuf_encode_template(template, b, b.byteLength) !== 0) throw new Error("template refused");
      cases.push({ name, chunks: next.chunks, n: next.dispatches, best: Infinity, template });
      cases.push({
        name: `like-same ${auto ? "auto" : "off "}`,
        chunks: base.chunks,
        n: base.dispatches,
        best: Infinity,
        template,
      });
    } else if (mode === "step") {
      const { chunks, dispatches } = await stepChunks(auto);
      cases.push({ name, chunks, n: dispatches, best: Infinity });
    } else cases.push({ name, chunks: stream(auto, mode), n: N, best: Infinity });
  }
}
const dump = Deno.env.get("DUMP");
if (dump !== undefined) {
  for (const c of cases) {
    // u32 words: magic, version, dispatches; n allocs × {handle, size lo, size hi}; n pipelines ×
    // {handle, name bytes, name padded to words}; n chunks × {bytes, words}
    const w: number[] = [0x44584c4d, 1, c.n, allocs.size];
    for (const [h, n] of allocs) w.push(h, Number(n & 0xffffffffn), Number(n >> 32n));
    w.push(pipelines.size);
    for (const [h, name] of pipelines) {
      const b = new TextEncoder().encode(name), padded = new Uint8Array((b.length + 4) & ~3);
      padded.set(b);
      w.push(h, padded.length, ...new Uint32Array(padded.buffer));
    }
    w.push(c.chunks.length);
    for (const chunk of c.chunks) w.push(chunk.byteLength, ...new Uint32Array(chunk.slice().buffer));
    Deno.writeFileSync(`${dump}/${c.name.trim().replace(" ", "-")}.bin`, new Uint8Array(Uint32Array.from(w).buffer));
  }
}
for (let r = 0; r < reps; r++) {
  for (const c of cases) {
    const cb = sym.mlxn_cmdbuf_new(dev);
    const t0 = performance.now();
    let rc = 0;
    if (c.template) rc = sym.mlxn_cmdbuf_replay_like(cb, c.template, c.chunks[0]!, c.chunks[0]!.byteLength);
    else for (const chunk of c.chunks) rc |= sym.mlxn_cmdbuf_encode(cb, chunk, chunk.byteLength);
    const t = performance.now() - t0;
    sym.mlxn_cmdbuf_free(cb);
    if (rc !== 0) throw new Error(`${c.name}: rc ${rc}`);
    if (t < c.best) c.best = t;
  }
}
for (const c of cases) {
  console.log(
    c.name,
    (c.best * 1e6 / c.n).toFixed(1),
    c.template ? "ns/dispatch replay_like" : "ns/dispatch decode",
    c.n !== N ? `(${c.n} dispatches, ${c.chunks.length} chunks, ${(c.best * 1e3).toFixed(1)} µs)` : "",
  );
}
