/**
 * The op surface of a GraphSession: every op dispatcher of src/ops/ that a session offers as a
 * method, by method name. The session binds each one to its encoder and registry once (no
 * hand-written forwarding method per op), so `s.rmsNorm(x, w, y, o)` is
 * `ops.rmsNorm(encoder, registry, x, w, y, o)`.
 *
 * @module
 */

import { MlxError } from "./errors.ts";
import type { KernelRegistry } from "./kernels.ts";
import type { DispatchTarget } from "./ops/common.ts";
import * as ops from "./ops/mod.ts";

/** Op dispatchers by session method name; each takes `(target, registry, ...arguments)`. */
export const SESSION_OPS = {
  /** out = a + b. */
  elementwiseAdd: ops.elementwiseAdd,
  /** out = a · b. */
  elementwiseMul: ops.elementwiseMul,
  /** out = α·a + β·b. */
  axpby: ops.axpby,
  /** GELU (tanh form). */
  gelu: ops.gelu,
  /** SiLU. */
  silu: ops.silu,
  /** SwiGLU, silu(gate) · up in one kernel. */
  siluMul: ops.siluMul,
  /** Strided row copy (e.g. a K/V cache append). */
  stridedCopy: ops.stridedCopy,
  /** tanh(x / cap) · cap. */
  softcap: ops.softcap,
  /** Row softmax. */
  softmax: ops.softmax,
  /** RMS norm with a learned weight. */
  rmsNorm: ops.rmsNorm,
  /** Fused RMS norm × scale. */
  rmsNormMul: ops.rmsNormMul,
  /** Fused RMS norm × scale + residual. */
  rmsNormMulAdd: ops.rmsNormMulAdd,
  /** RMS norm without a weight. */
  rmsNormNoScale: ops.rmsNormNoScale,
  /** Rope over adjacent pairs. */
  rope: ops.rope,
  /** NeoX rope. */
  ropeNeox: ops.ropeNeox,
  /** Rope over adjacent pairs with per-pair frequency factors (ggml's normal mode). */
  ropeNorm: ops.ropeNorm,
  /** y = x · Wᵀ (+ residual), dense f32/bf16 weights. */
  matmul: ops.matmul,
  /** y = x · Wᵀ, MLX affine-quantized weights. */
  quantizedMatmul: ops.quantizedMatmul,
  /** y = x · Wᵀ, ggml block weights. */
  quantizedMatmulGgml: ops.quantizedMatmulGgml,
  /** MoE expert-routed product, ggml block weights. */
  quantizedMatmulIdGgml: ops.quantizedMatmulIdGgml,
  /** MoE expert-routed product, MLX affine weights (MLX's gather_qmm). */
  quantizedMatmulAffineGather: ops.quantizedMatmulAffineGather,
  /** Causal scaled dot-product attention. */
  sdpa: ops.sdpa,
  /** Decode attention, split over workgroups then reduced (places its own barrier). */
  flashAttnVec: ops.flashAttnVec,
  /** Greedy token choice per logits row, written into a device ring of token ids. */
  argmax: ops.argmax,
  /** Seeded temperature / top-k / top-p sampling per logits row (the same ids on every backend). */
  sample: ops.sample,
  /** Embedding rows gathered by token ids read from device memory. */
  embedGather: ops.embedGather,
  /** Advances a DecodeLoop step state on the device (position + 1, next ring slot). */
  stepAdvance: ops.stepAdvance,
} as const;

/** The arguments of an op dispatcher after its target and registry. */
export type OpArguments<F> = F extends (target: DispatchTarget, registry: KernelRegistry, ...args: infer A) => void ? A
  : never;

/** Every op of {@link SESSION_OPS} as a session method: the same arguments, without target and registry. */
export type SessionOps = {
  readonly [K in keyof typeof SESSION_OPS]: (...args: OpArguments<typeof SESSION_OPS[K]>) => void;
};

/** Most arguments a session op takes after target and registry. */
export const MAX_OP_ARGUMENTS = 7;

/** An op dispatcher of {@link SESSION_OPS}, untyped. */
export type AnyOp = (target: DispatchTarget, registry: KernelRegistry, ...args: unknown[]) => void;

/**
 * Makes session method `name`: `this` is the session, `encoderOf(this, name)` its target (it throws
 * on a closed session) and `registryOf(this)` its registry, then `op` gets the method's arguments
 * (fixed parameters, no rest array: one call deep). Its `length` is the op's own argument count
 * (`op.length - 2`: the dispatchers have no default or rest parameters). Closures of one function
 * literal share V8's call feedback, so where a caller does not inline the method its call of the op
 * is generic; a model's step inlines them (a method compiled per op measured the same there).
 * A TypeError from a missing argument (an options object read as undefined) or from a method called
 * without its session (`isSession(this)` false) becomes an InvalidArgument MlxError that says so.
 */
export function sessionMethod<S>(
  name: string,
  op: AnyOp,
  encoderOf: (session: S, name: string) => DispatchTarget,
  registryOf: (session: S) => KernelRegistry,
  isSession: (self: unknown) => boolean,
): (this: S, ...args: unknown[]) => void {
  const arity = op.length - 2;
  if (arity < 0 || arity > MAX_OP_ARGUMENTS) throw new Error(`${name}: not an op dispatcher that a session can bind`);
  const misuse = (self: unknown, err: TypeError): MlxError =>
    new MlxError(
      "InvalidArgument",
      isSession(self)
        ? `${name}: ${err.message}: pass all ${arity} of its arguments, as SessionOps documents them`
        : `${name}: called without its session: call it as session.${name}(…) or bind it to the session`,
      { cause: err },
    );
  const method = function (
    this: S,
    a: unknown,
    b: unknown,
    c: unknown,
    d: unknown,
    e: unknown,
    f: unknown,
    g: unknown,
  ) {
    try {
      op(encoderOf(this, name), registryOf(this), a, b, c, d, e, f, g);
    } catch (err) {
      throw err instanceof TypeError ? misuse(this, err) : err;
    }
  };
  Object.defineProperty(method, "name", { value: name });
  Object.defineProperty(method, "length", { value: arity });
  return method;
}
