// Rotary embeddings (f32), one thread per rotated pair (as kernels/cpu/rope.c). Parameter blocks:
// the generated mlxn_params_rope, mlxn_params_rope_heads and mlxn_params_rope_layout (_params.gen.metal).

kernel void rope_f32(device const float *in [[buffer(0)]], device float *out [[buffer(1)]],
                     constant mlxn_params_rope &p [[buffer(2)]], device const uint *pos [[buffer(3)]], MLXN_ARGS_TAIL) {
  uint i = gid.x * tpg.x + lid.x, t = gid.y * tpg.y + lid.y;
  if (i >= p.head_dim / 2 || i >= grid.x || t >= p.seq_len || t >= grid.y) return;
  float ang = float(pos[t]) * precise::pow(p.theta, -2.0f * float(i) / float(p.head_dim));
  float c = precise::cos(ang), s = precise::sin(ang);
  ulong j = ulong(t) * p.head_dim + 2 * i;
  float x0 = in[j], x1 = in[j + 1];
  out[j] = x0 * c - x1 * s;
  out[j + 1] = x0 * s + x1 * c;
}

// Pair i of a row: (i, i + rope_dim/2) (NeoX) or (2i, 2i + 1) (adjacent: ggml's normal mode).
inline void rope_heads(device const float *in, device float *out, constant mlxn_params_rope_heads &p,
                       device const uint *pos, constant mlxn_params_rope_layout &h, device const float *ff,
                       device const uint *state, uint i, uint r, uint2 grid2, bool adjacent, uint tag,
                       device atomic_uint *fault_word) {
  uint half_dim = p.rope_dim / 2;
  if (i >= half_dim || i >= grid2.x || r >= grid2.y) return;
  // Step state: token t at state[0] + t, rows moved by state[0]·out_pos_stride, bounded by max_pos.
  uint base = h.has_state ? state[0] : 0;
  if (h.has_state && base >= h.max_pos) {
    report_fault(fault_word, tag);
    return;
  }
  float freq = precise::pow(p.theta, -2.0f * float(i) / float(p.rope_dim));
  if (h.has_freq_factors) freq = freq / ff[i];
  float ang = float(h.has_state ? base + r / h.n_heads : pos[r / h.n_heads]) * freq;
  float c = precise::cos(ang), s = precise::sin(ang);
  ulong row = ulong(r) * p.head_dim;
  ulong orow = ulong(base) * h.out_pos_stride + ulong(r / h.n_heads) * h.out_token_stride +
               ulong(r % h.n_heads) * h.out_head_stride;
  uint i0 = adjacent ? 2 * i : i, i1 = adjacent ? 2 * i + 1 : i + half_dim;
  float x0 = in[row + i0], x1 = in[row + i1];
  out[orow + i0] = x0 * c - x1 * s;
  out[orow + i1] = x0 * s + x1 * c;
  for (uint d = p.rope_dim + i; d < p.head_dim; d += half_dim) out[orow + d] = in[row + d];
}

kernel void rope_neox_f32(device const float *in [[buffer(0)]], device float *out [[buffer(1)]],
                          constant mlxn_params_rope_heads &p [[buffer(2)]], device const uint *pos [[buffer(3)]],
                          constant mlxn_params_rope_layout &h [[buffer(4)]], device const float *ff [[buffer(5)]],
                          device const uint *state [[buffer(6)]], MLXN_ARGS_TAIL) {
  rope_heads(in, out, p, pos, h, ff, state, gid.x * tpg.x + lid.x, gid.y * tpg.y + lid.y, grid.xy, false, tag,
             fault_word);
}

kernel void rope_norm_f32(device const float *in [[buffer(0)]], device float *out [[buffer(1)]],
                          constant mlxn_params_rope_heads &p [[buffer(2)]], device const uint *pos [[buffer(3)]],
                          constant mlxn_params_rope_layout &h [[buffer(4)]], device const float *ff [[buffer(5)]],
                          device const uint *state [[buffer(6)]], MLXN_ARGS_TAIL) {
  rope_heads(in, out, p, pos, h, ff, state, gid.x * tpg.x + lid.x, gid.y * tpg.y + lid.y, grid.xy, true, tag,
             fault_word);
}
