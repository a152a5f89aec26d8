/**
 * The native decoder's cost per dispatch, with and without automatic barriers: a prebuilt stream of
 * 800 elementwise_add_f32 dispatches (two whole-buffer inputs; the output a slice in order ("slices"),
 * in shuffled order ("shuffled"), or one whole buffer ("hazard")) handed to `mlxn_cmdbuf_encode` of a
 * fresh command buffer, best of 3,000. Nothing runs.
 *
 *   ROOT=<tree> deno run -A bench/native_decode_harness.ts [slices,hazard,shuffled]   (AUTO=0: tracking off only)
 */
const root = (Deno.env.get("ROOT") ?? new URL("..", import.meta.url).pathname).replace(/\/$/, "");
const { DType, MlxDevice } = await import(`file://${root}/mod.ts`);
const { recordHeader, Op } = await import(`file://${root}/src/native/abi.ts`);
const device = MlxDevice.open({ backend: "cpu" });
const sym = device.sym;
const N = 800, E = 64;
const x = device.upload(new Float32Array(E)), y = device.upload(new Float32Array(E));
const wide = device.alloc(N * E * 4, DType.F32);
const out = device.alloc(E * 4, DType.F32);
const add = device.kernels.get("elementwise_add_f32").handle;
let seed = 7;
const perm = Array.from({ length: N }, (_, i) => i).sort(() =>
  (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648 - 0.5
);
function stream(auto: boolean, mode: string): Uint8Array {
  const w: number[] = [];
  if (auto) w.push(recordHeader(Op.AUTO_BARRIERS, 1, 1));
  w.push(recordHeader(Op.SET_PIPELINE, 2), add);
  for (let i = 0; i < N; i++) {
    w.push(recordHeader(Op.SET_BUFFER_WHOLE, 2, 0), x.handle, recordHeader(Op.SET_BUFFER_WHOLE, 2, 1), y.handle);
    if (mode === "hazard") w.push(recordHeader(Op.SET_BUFFER_WHOLE, 2, 2), out.handle);
    else w.push(recordHeader(Op.SET_BUFFER, 4, 2), wide.handle, (mode === "shuffled" ? perm[i]! : i) * E * 4, E * 4);
    w.push(recordHeader(Op.SET_BYTES, 3, 3), 4, E);
    w.push(recordHeader(Op.DISPATCH_THREADS, 8), E, 1, 1, E, 1, 1, i);
  }
  return new Uint8Array(Uint32Array.from(w).buffer);
}
// deno-lint-ignore no-explicit-any
const dev = (device as any).devicePtr();
for (const mode of (Deno.args[0] ?? "slices,hazard,shuffled").split(",")) {
  for (const auto of (Deno.env.get("AUTO") === "0" ? [false] : [false, true])) {
    const s = stream(auto, mode);
    let best = Infinity;
    for (let r = 0; r < 3000; r++) {
      const cb = sym.mlxn_cmdbuf_new(dev);
      const t0 = performance.now();
      const rc = sym.mlxn_cmdbuf_encode(cb, s, s.byteLength);
      const t = performance.now() - t0;
      if (rc !== 0) {
        throw new Error("rc " + rc);
      }
      sym.mlxn_cmdbuf_free(cb);
      if (t < best) best = t;
    }
    console.log(mode, auto ? "auto" : "off ", (best * 1e6 / N).toFixed(1), "ns/dispatch decode");
  }
}
