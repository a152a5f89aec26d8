// Elementwise MSL kernels: one thread per element (as kernels/cpu/elementwise.c). Parameter blocks:
// the generated mlxn_params_* structs (_params.gen.metal).

#define BINARY(NAME, T, OP)                                                                         \
  kernel void NAME(device const T *a [[buffer(0)]], device const T *b [[buffer(1)]],                \
                   device T *out [[buffer(2)]], constant mlxn_params_n &p [[buffer(3)]],            \
                   MLXN_ARGS_TAIL) {                                                                \
    ulong i = ulong(gid.x) * tpg.x + lid.x;                                                         \
    if (i >= p.n || i >= grid.x) return;                                                            \
    st(out, i, ld(a, i) OP ld(b, i));                                                               \
  }
BINARY(elementwise_add_f32, float, +)
BINARY(elementwise_add_f16, half, +)
BINARY(elementwise_add_bf16, ushort, +)
BINARY(elementwise_mul_f32, float, *)
BINARY(elementwise_mul_f16, half, *)
BINARY(elementwise_mul_bf16, ushort, *)

inline float gelu_tanh(float x) {
  float inner = clamp(0.7978845608028654f * (x + 0.044715f * x * x * x), -15.0f, 15.0f);
  return 0.5f * x * (1.0f + precise::tanh(inner));
}

#define UNARY(NAME, T, FN)                                                                          \
  kernel void NAME(device const T *in [[buffer(0)]], device T *out [[buffer(1)]], MLXN_ARGS_TAIL) { \
    ulong i = ulong(gid.x) * tpg.x + lid.x;                                                         \
    if (i >= grid.x) return;                                                                        \
    st(out, i, FN(ld(in, i)));                                                                      \
  }
UNARY(gelu_f32, float, gelu_tanh)
UNARY(gelu_f16, half, gelu_tanh)
UNARY(gelu_bf16, ushort, gelu_tanh)
UNARY(silu_f32, float, silu)
UNARY(silu_f16, half, silu)
UNARY(silu_bf16, ushort, silu)

// SwiGLU: silu(gate) rounded to the storage type, times up (equals the silu → mul pair).
#define SILU_MUL(NAME, T)                                                                           \
  kernel void NAME(device const T *gate [[buffer(0)]], device const T *up [[buffer(1)]],            \
                   device T *out [[buffer(2)]], constant mlxn_params_n &p [[buffer(3)]],            \
                   MLXN_ARGS_TAIL) {                                                                \
    ulong i = ulong(gid.x) * tpg.x + lid.x;                                                         \
    if (i >= p.n || i >= grid.x) return;                                                            \
    st(out, i, round_to(silu(ld(gate, i)), gate) * ld(up, i));                                      \
  }
SILU_MUL(silu_mul_f32, float)
SILU_MUL(silu_mul_f16, half)
SILU_MUL(silu_mul_bf16, ushort)

kernel void softcap_f32(device const float *in [[buffer(0)]], device float *out [[buffer(1)]],
                        constant mlxn_params_softcap &p [[buffer(2)]], MLXN_ARGS_TAIL) {
  ulong i = ulong(gid.x) * tpg.x + lid.x;
  if (i >= p.n || i >= grid.x) return;
  out[i] = precise::tanh(in[i] / p.cap) * p.cap;
}

kernel void axpby_f32(device const float *a [[buffer(0)]], device const float *b [[buffer(1)]],
                      device float *out [[buffer(2)]], constant mlxn_params_axpby &p [[buffer(3)]], MLXN_ARGS_TAIL) {
  ulong i = ulong(gid.x) * tpg.x + lid.x;
  if (i >= p.n || i >= grid.x) return;
  out[i] = p.alpha * a[i] + p.beta * b[i];
}

// scale_f32: out = alpha · x.
kernel void scale_f32(device const float *x [[buffer(0)]], device float *out [[buffer(1)]],
                      constant mlxn_params_scale &p [[buffer(2)]], MLXN_ARGS_TAIL) {
  ulong i = ulong(gid.x) * tpg.x + lid.x;
  if (i >= p.n || i >= grid.x) return;
  out[i] = p.alpha * x[i];
}

kernel void strided_copy_f32(device const float *src [[buffer(0)]], device float *dst [[buffer(1)]],
                             constant mlxn_params_strided_copy &p [[buffer(2)]], device const uint *state [[buffer(3)]],
                             MLXN_ARGS_TAIL) {
  uint c = gid.x * tpg.x + lid.x, r = gid.y * tpg.y + lid.y;
  if (c >= p.cols || r >= p.rows || c >= grid.x || r >= grid.y) return;
  ulong o = 0; // step state: rows moved by state[0]·dst_pos_stride, bounded by max_pos
  if (p.has_state) {
    if (state[0] >= p.max_pos) {
      report_fault(fault_word, tag);
      return;
    }
    o = ulong(state[0]) * p.dst_pos_stride;
  }
  dst[o + ulong(r) * p.dst_stride + c] = src[ulong(r) * p.src_stride + c];
}

kernel void debug_fault(device uint *marker [[buffer(0)]], constant mlxn_params_debug_fault &p [[buffer(1)]],
                        MLXN_ARGS_TAIL) {
  if (lid.x != 0 || gid.x != 0) return;
  if (p.fail) report_fault(fault_word, tag);
  else marker[0] = 1;
}
