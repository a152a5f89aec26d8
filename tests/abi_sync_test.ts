/** Keeps src/native/abi.ts and src/native/ffi.ts in step with native/mlxn.h. */
import { deepStrictEqual, ok } from "node:assert/strict";
import {
  ABI_VERSION,
  CbStatus,
  Flag,
  Limits,
  Live,
  Op,
  PATCH_WORDS,
  RecordWords,
  Status,
  UNLIKE,
} from "../src/native/abi.ts";
import { symbols } from "../src/native/ffi.ts";

const header = Deno.readTextFileSync(new URL("../native/mlxn.h", import.meta.url));

function defines(prefix: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const m of header.matchAll(/^#define MLXN_(\w+) (-?\d+)/gm)) {
    if (m[1]!.startsWith(prefix)) out[m[1]!.slice(prefix.length)] = Number(m[2]);
  }
  return out;
}

Deno.test("ABI version matches the header", () => {
  deepStrictEqual(defines("ABI_VERSION"), { "": ABI_VERSION });
});

Deno.test("status codes, opcodes, record sizes, limits, flags, states and live indices match", () => {
  const status = { ...defines("E_"), OK: defines("OK")[""] };
  deepStrictEqual(status, Object.fromEntries(Object.entries(Status).map(([k, v]) => [k.replace(/^E_/, ""), v])));
  deepStrictEqual(defines("OP_"), { ...Op });
  const rec = Object.fromEntries(Object.entries(defines("REC_")).map(([k, v]) => [k.replace(/_WORDS$/, ""), v]));
  deepStrictEqual(rec, { ...RecordWords });
  deepStrictEqual(defines("MAX_"), Object.fromEntries(Object.entries(Limits).map(([k, v]) => [k.slice(4), v])));
  deepStrictEqual(defines("FLAG_"), { ...Flag });
  deepStrictEqual(defines("CB_"), { ...CbStatus });
  deepStrictEqual(defines("LIVE_"), { ...Live });
  deepStrictEqual(defines("PATCH_WORDS"), { "": PATCH_WORDS });
  deepStrictEqual(defines("UNLIKE"), { "": UNLIKE });
});

Deno.test("every ABI function of the header is in the FFI symbol table and vice versa", () => {
  const declared = new Set([...header.matchAll(/^MLXN_API [^(]*?\b(mlxn_\w+)\(/gm)].map((m) => m[1]));
  const bound = new Set(
    Object.entries(symbols).map(([k, v]) => ("name" in v ? v.name : k) as string),
  );
  ok(declared.size >= 20, `parsed only ${declared.size} declarations`);
  deepStrictEqual([...bound].sort(), [...declared].sort());
});
