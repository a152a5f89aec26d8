/**
 * Writes the fuzzer's seed corpus (tests/fuzz/corpus/*.bin): valid streams for several kernels,
 * using the handles the fuzz target's device creates (buffers 1..4) and this build's pipeline
 * handles. Each file starts with the 2-byte chunk split the target reads.
 *
 *   deno run --allow-ffi --allow-read --allow-write --allow-env tests/fuzz/make_corpus.ts
 */
import { KernelRegistry, MlxDevice } from "../../mod.ts";
import { Op, recordHeader } from "../../src/native/abi.ts";
import { f32Bits } from "../../src/ops/common.ts";

using device = MlxDevice.open({ backend: "cpu" });
const reg = new KernelRegistry(device);
const h = (name: string) => reg.get(name).handle;
const rec = (op: number, slot: number, ...p: number[]) => [recordHeader(op, 1 + p.length, slot), ...p];
const buf = (slot: number, handle: number, off: number, len: number) => rec(Op.SET_BUFFER, slot, handle, off, len);
const seeds: Record<string, number[]> = {
  add: [
    ...rec(Op.SET_PIPELINE, 0, h("elementwise_add_f32")),
    ...buf(0, 3, 0, 4096),
    ...buf(1, 3, 0, 4096),
    ...buf(2, 4, 0, 4096),
    ...rec(Op.SET_BYTES, 3, 4, 1024),
    ...rec(Op.DISPATCH_THREADS, 0, 1024, 1, 1, 256, 1, 1, 0),
    ...rec(Op.BARRIER, 0),
  ],
  norm: [
    ...rec(Op.SET_PIPELINE, 0, h("rms_norm_f32")),
    ...buf(0, 3, 0, 4096),
    ...buf(1, 2, 0, 256),
    ...buf(2, 4, 4096, 4096),
    ...rec(Op.SET_BYTES, 3, 8, f32Bits(1e-5), 64),
    ...rec(Op.SET_TG_MEMORY, 0, 256),
    ...rec(Op.DISPATCH_GROUPS, 0, 16, 1, 1, 64, 1, 1, 0),
  ],
  rope_neox: [
    ...rec(Op.SET_PIPELINE, 0, h("rope_neox_f32")),
    ...buf(0, 3, 0, 4096),
    ...buf(1, 4, 0, 4096),
    ...rec(Op.SET_BYTES, 2, 12, f32Bits(1e4), 64, 32),
    ...buf(3, 1, 0, 64),
    ...rec(Op.SET_BYTES, 4, 8, 4, 0),
    ...rec(Op.DISPATCH_THREADS, 0, 16, 16, 1, 16, 1, 1, 0),
  ],
  q8_0: [
    ...rec(Op.SET_PIPELINE, 0, h("qmatmul_q8_0_mv")),
    ...buf(0, 2, 0, 256),
    ...buf(1, 3, 0, 4096),
    ...buf(2, 1, 0, 64),
    ...rec(Op.SET_BYTES, 3, 12, 1, 16, 64),
    ...rec(Op.DISPATCH_GROUPS, 0, 4, 1, 1, 128, 1, 1, 0),
  ],
  flash: [
    ...rec(Op.SET_PIPELINE, 0, h("flash_attn_vec_f32")),
    ...buf(0, 2, 0, 256),
    ...buf(1, 4, 0, 65536),
    ...buf(2, 4, 0, 65536),
    ...buf(3, 4, 0, 65536),
    ...rec(Op.SET_BYTES, 4, 40, 1, 1, 64, 8, 64, f32Bits(0.125), 2, 4, 0, 4),
    ...rec(Op.DISPATCH_GROUPS, 0, 1, 4, 1, 32, 1, 1, 0),
  ],
  buffer64: [
    ...rec(Op.SET_PIPELINE, 0, h("gelu_f32")),
    ...rec(Op.SET_BUFFER64, 0, 3, 0, 0, 4096, 0),
    ...buf(1, 4, 0, 4096),
    ...rec(Op.DISPATCH_THREADS, 0, 1024, 1, 1, 256, 1, 1, 0),
  ],
};
const dir = new URL("./corpus/", import.meta.url);
Deno.mkdirSync(dir, { recursive: true });
for (const [name, words] of Object.entries(seeds)) {
  const body = new Uint8Array(Uint32Array.from(words).buffer);
  const file = new Uint8Array(2 + body.length);
  const split = Math.floor(body.length / 8) * 4; // split mid-stream, on a word boundary
  file.set([split & 0xff, split >> 8], 0);
  file.set(body, 2);
  Deno.writeFileSync(new URL(`${name}.bin`, dir), file);
}
console.log(`wrote ${Object.keys(seeds).length} seeds to ${dir.pathname}`);
