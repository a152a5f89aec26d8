/**
 * Writes the replay-like fuzzer's seeds (into the directory given, `make` uses build/like-corpus) from
 * the stream fuzzer's corpus (tests/fuzz/corpus, written by make_corpus.ts): for every seed stream, the stream as its own
 * template with no mutation (a plain replay), and with one mutation of each kind of patchable word it
 * has (the first inline-constant word: +1; the first SET_BUFFER's offset: +4 bytes, also on the
 * target's serial device; its length: −4 bytes) and of one fixed word (the first dispatch's tag), as
 * tests/fuzz/fuzz_replay_like.c reads
 * them: u32 template length, the template, then {u32 word index, u32 value} per mutation.
 *
 *   deno run --allow-read --allow-write tests/fuzz/make_like_corpus.ts build/like-corpus
 */
import { LEN_SHIFT, Op, OP_MASK } from "../../src/native/abi.ts";

if (Deno.args.length !== 1) throw new Error("usage: make_like_corpus.ts OUTPUT_DIR");
const dir = new URL("./corpus/", import.meta.url);
const out = new URL(`${Deno.args[0]!.replace(/\/$/, "")}/`, `file://${Deno.cwd()}/`);
Deno.mkdirSync(out, { recursive: true });
for (const f of Deno.readDirSync(out)) if (f.name.endsWith(".bin")) Deno.removeSync(new URL(f.name, out));

/** A seed: the template, then the mutations; `serial` runs it on the target's serial device. */
function seed(t: Uint32Array, mutations: [number, number][], serial = false): Uint8Array {
  const w = new Uint32Array(1 + t.length + 2 * mutations.length);
  w[0] = (t.length * 4 | (serial ? 0x80000000 : 0)) >>> 0;
  w.set(t, 1);
  mutations.forEach(([i, v], k) => w.set([i, v >>> 0], 1 + t.length + 2 * k));
  return new Uint8Array(w.buffer);
}

let written = 0;
for (const f of [...Deno.readDirSync(dir)].map((e) => e.name).filter((n) => n.endsWith(".bin")).sort()) {
  const bytes = Deno.readFileSync(new URL(f, dir)).subarray(2); // the stream seed's 2-byte chunk split
  const t = new Uint32Array(bytes.slice(0, bytes.byteLength & ~3).buffer);
  const picks: Record<string, [number, number][]> = { same: [] };
  for (let at = 0; at < t.length;) {
    const h = t[at]!, op = h & OP_MASK, len = h >>> LEN_SHIFT;
    if (len === 0 || at + len > t.length) break;
    if (op === Op.SET_BYTES && len > 2 && !picks.constant) picks.constant = [[at + 2, t[at + 2]! + 1]];
    if (op === Op.SET_BUFFER && !picks.offset) {
      picks.offset = [[at + 2, t[at + 2]! + 4]];
      if (t[at + 3]! >= 8) picks.length = [[at + 3, t[at + 3]! - 4]];
    }
    if ((op === Op.DISPATCH_THREADS || op === Op.DISPATCH_GROUPS) && !picks.tag) picks.tag = [[at + 7, t[at + 7]! + 1]];
    at += len;
  }
  for (const [kind, m] of Object.entries(picks)) {
    Deno.writeFileSync(new URL(`${f.replace(/\.bin$/, "")}-${kind}.bin`, out), seed(t, m));
    written++;
  }
  if (picks.offset) { // a moved view on the serial device too
    Deno.writeFileSync(new URL(`${f.replace(/\.bin$/, "")}-serial-offset.bin`, out), seed(t, picks.offset, true));
    written++;
  }
}
console.log(`${written} seeds in ${Deno.args[0]}`);
