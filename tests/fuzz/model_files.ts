/**
 * Mutation fuzzing of the GGUF and safetensors readers: valid seed files (written by the test
 * writers) are mutated byte-wise, with 64-bit "interesting" values over length and count fields,
 * truncated, extended and spliced; each input is parsed and every tensor read back. Anything thrown
 * that is not an MlxError is a finding.
 *
 *   deno run --allow-read --allow-write tests/fuzz/model_files.ts [iterations=1000000] [seed=1]
 *
 * Findings are written to build/fuzz-model-files/ and the run exits 1.
 */
import { GgufFile, GgufValueType, llamaConfigFromGguf, MlxError, quantizeGgml, SafetensorsFile } from "../../mod.ts";
import { rng } from "../helpers.ts";
import { writeGguf } from "../helpers/gguf_writer.ts";
import { bytesOf, writeSafetensors } from "../helpers/safetensors_writer.ts";

const T = GgufValueType;

/** Valid seed files of both formats. */
export function seeds(): { gguf: Uint8Array[]; safetensors: Uint8Array[] } {
  const w = Float32Array.from({ length: 512 }, (_, i) => Math.sin(i) * 2);
  const gguf = [
    writeGguf([
      { key: "general.architecture", type: T.STRING, value: "llama" },
      { key: "llama.embedding_length", type: T.UINT32, value: 256 },
      { key: "llama.feed_forward_length", type: T.UINT32, value: 512 },
      { key: "llama.block_count", type: T.UINT32, value: 1 },
      { key: "llama.attention.head_count", type: T.UINT32, value: 4 },
      { key: "llama.attention.layer_norm_rms_epsilon", type: T.FLOAT32, value: 1e-5 },
      { key: "llama.context_length", type: T.UINT32, value: 128 },
      { key: "tokenizer.ggml.tokens", type: T.ARRAY, elementType: T.STRING, value: ["<s>", "a", "b"] },
      { key: "tokenizer.ggml.scores", type: T.ARRAY, elementType: T.FLOAT32, value: [0, 1, 2] },
      { key: "x.u64", type: T.UINT64, value: 7n },
      { key: "x.flags", type: T.ARRAY, elementType: T.BOOL, value: [true, false] },
    ], [
      { name: "token_embd.weight", type: "q4_k", ne: [256, 2], data: quantizeGgml(w, 2, 256, "q4_k") },
      { name: "output_norm.weight", type: "f32", ne: [256], data: bytesOf(w.subarray(0, 256)) },
      { name: "blk.0.ffn_down.weight", type: "q6_k", ne: [256, 1], data: quantizeGgml(w, 1, 256, "q6_k") },
    ]),
    writeGguf([{ key: "general.alignment", type: T.UINT32, value: 64 }], [
      { name: "a", type: "q8_0", ne: [32, 2], data: quantizeGgml(w, 2, 32, "q8_0") },
      { name: "b", type: "f16", ne: [3], data: new Uint8Array(6) },
    ], { alignment: 64 }),
    writeGguf([{ key: "s", type: T.STRING, value: "x" }], [], { version: 2 }),
  ];
  const safetensors = [
    writeSafetensors([
      { name: "a.weight", dtype: "U32", shape: [2, 2], data: new Uint8Array(16) },
      { name: "a.scales", dtype: "BF16", shape: [2, 1], data: new Uint8Array(4) },
      { name: "a.biases", dtype: "BF16", shape: [2, 1], data: new Uint8Array(4) },
      { name: "n", dtype: "F32", shape: [3], data: bytesOf(w.subarray(0, 3)) },
    ], { format: "mlx" }),
    writeSafetensors([{ name: "e", dtype: "I64", shape: [0], data: new Uint8Array(0) }]),
  ];
  return { gguf, safetensors };
}

const INTERESTING_U64 = [
  0n,
  1n,
  2n,
  3n,
  4n,
  31n,
  32n,
  255n,
  256n,
  65535n,
  2n ** 31n - 1n,
  2n ** 31n,
  2n ** 32n - 1n,
  2n ** 32n,
  2n ** 53n,
  2n ** 53n + 1n,
  2n ** 62n,
  2n ** 63n - 1n,
  2n ** 63n,
  2n ** 64n - 1n,
];

/** One mutation of `input` (possibly spliced with `other`). */
export function mutate(input: Uint8Array, other: Uint8Array, next: () => number): Uint8Array {
  const pick = (n: number) => Math.floor(next() * n);
  let out = input.slice();
  const rounds = 1 + pick(4);
  for (let r = 0; r < rounds; r++) {
    const at = out.length ? pick(out.length) : 0;
    switch (pick(9)) {
      case 0: // bit flip
        if (out.length) out[at]! ^= 1 << pick(8);
        break;
      case 1: // interesting byte
        if (out.length) out[at] = [0, 1, 0x7f, 0x80, 0xff, 0x20, 0x7b, 0x22][pick(8)]!;
        break;
      case 2: { // interesting little-endian u64 / u32 at an 4-aligned position (counts, lengths, offsets)
        const v = INTERESTING_U64[pick(INTERESTING_U64.length)]! + BigInt(pick(3)) - 1n;
        const bytes = new Uint8Array(BigUint64Array.of(BigInt.asUintN(64, v)).buffer);
        const a = at & ~3, len = pick(2) ? 8 : 4;
        for (let i = 0; i < len && a + i < out.length; i++) out[a + i] = bytes[i]!;
        break;
      }
      case 3: // truncate
        out = out.slice(0, pick(out.length + 1));
        break;
      case 4: { // extend
        const extra = new Uint8Array(pick(64));
        for (let i = 0; i < extra.length; i++) extra[i] = pick(256);
        const o = new Uint8Array(out.length + extra.length);
        o.set(out);
        o.set(extra, out.length);
        out = o;
        break;
      }
      case 5: { // delete a chunk
        const len = pick(16);
        out = new Uint8Array([...out.subarray(0, at), ...out.subarray(at + len)]);
        break;
      }
      case 6: { // duplicate a chunk
        const len = pick(32);
        out = new Uint8Array([...out.subarray(0, at), ...out.subarray(at, at + len), ...out.subarray(at)]);
        break;
      }
      case 7: { // splice the other seed's tail
        const from = pick(other.length + 1);
        out = new Uint8Array([...out.subarray(0, at), ...other.subarray(from)]);
        break;
      }
      default: // random byte
        if (out.length) out[at] = pick(256);
    }
  }
  return out;
}

const JSON_VALUES: unknown[] = [
  0,
  1,
  -1,
  2.5,
  2 ** 31,
  2 ** 53,
  2 ** 64,
  1e308,
  "F32",
  "U32",
  "BF16",
  "F4",
  "",
  null,
  true,
  [],
  [0],
  [0, 0],
  [1, 0],
  [0, 2 ** 60],
  {},
];

/** A structure-aware safetensors mutation: one field of the JSON header replaced. */
export function mutateSafetensorsHeader(input: Uint8Array, next: () => number): Uint8Array {
  const pick = (n: number) => Math.floor(next() * n);
  const n = Number(new DataView(input.buffer, input.byteOffset).getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(input.subarray(8, 8 + n))) as Record<
    string,
    Record<string, unknown>
  >;
  const names = Object.keys(header);
  if (names.length === 0) return input;
  const name = names[pick(names.length)]!;
  const field = ["dtype", "shape", "data_offsets", "extra"][pick(4)]!;
  const value = JSON_VALUES[pick(JSON_VALUES.length)];
  if (pick(8) === 0) header[name] = value as Record<string, unknown>;
  else if (field === "shape" && Array.isArray(header[name]?.shape) && pick(2)) {
    const shape = [...header[name].shape as unknown[]];
    shape[pick(shape.length + 1)] = value;
    header[name].shape = shape;
  } else if (header[name] && typeof header[name] === "object") header[name][field] = value;
  const json = new TextEncoder().encode(JSON.stringify(header));
  const out = new Uint8Array(8 + json.length + input.length - 8 - n);
  new DataView(out.buffer).setBigUint64(0, BigInt(json.length), true);
  out.set(json, 8);
  out.set(input.subarray(8 + n), 8 + json.length);
  return out;
}

/** Parses one input fully; returns a finding (non-MlxError throw) or undefined. */
export function runOne(kind: "gguf" | "safetensors", input: Uint8Array): unknown {
  try {
    if (kind === "gguf") {
      using f = GgufFile.open(input);
      for (const t of f.tensors) f.readTensorBytes(t.name);
      try {
        llamaConfigFromGguf(f);
      } catch (e) {
        if (!(e instanceof MlxError)) throw e;
      }
    } else {
      using f = SafetensorsFile.open(input);
      for (const t of f.tensors) f.readTensorBytes(t.name);
    }
  } catch (e) {
    if (!(e instanceof MlxError)) return e;
  }
  return undefined;
}

/** Runs `iterations` mutated inputs; returns the number of findings (and, for CLI use, reports). */
export function fuzz(
  iterations: number,
  seed: number,
  onFinding?: (input: Uint8Array, kind: string, e: unknown) => void,
) {
  const next = rng(seed);
  const s = seeds();
  let findings = 0, accepted = 0;
  for (let i = 0; i < iterations; i++) {
    const kind = next() < 0.6 ? "gguf" : "safetensors";
    const pool = s[kind];
    const a = pool[Math.floor(next() * pool.length)]!, b = pool[Math.floor(next() * pool.length)]!;
    let input: Uint8Array;
    try {
      input = kind === "safetensors" && next() < 0.5 ? mutateSafetensorsHeader(a, next) : mutate(a, b, next);
    } catch {
      input = mutate(a, b, next); // a kept seed whose header no longer parses as JSON
    }
    const finding = runOne(kind, input);
    if (finding !== undefined) {
      findings++;
      onFinding?.(input, kind, finding);
    } // Accepted mutants (parsed without error) become seeds too, so later rounds go deeper.
    else if (pool.length < 64 && next() < 0.01) {
      try {
        if (kind === "gguf") GgufFile.open(input).close();
        else SafetensorsFile.open(input).close();
        pool.push(input);
        accepted++;
      } catch { /* rejected mutant */ }
    }
  }
  return { findings, accepted };
}

if (import.meta.main) {
  const iterations = Number(Deno.args[0] ?? 1_000_000), seed = Number(Deno.args[1] ?? 1);
  const dir = "build/fuzz-model-files";
  const start = performance.now();
  const { findings, accepted } = fuzz(iterations, seed, (input, kind, e) => {
    Deno.mkdirSync(dir, { recursive: true });
    const name = `${dir}/${kind}-${crypto.randomUUID()}.bin`;
    Deno.writeFileSync(name, input);
    console.error(`finding (${kind}): ${(e as Error)?.stack ?? e} → ${name}`);
  });
  const s = (performance.now() - start) / 1000;
  console.log(
    `${iterations} inputs, seed ${seed}: ${findings} findings, ${accepted} mutants kept as seeds, ${s.toFixed(1)} s`,
  );
  if (findings > 0) Deno.exit(1);
}
