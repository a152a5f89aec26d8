// Glue between the generated kernel entry points and the emulator (not part of MSL): turns the
// runtime's untyped argument table into each kernel parameter's declared type.
#ifndef MLXN_EMU_BIND_H
#define MLXN_EMU_BIND_H

#include "../emu_abi.h"

namespace mlxn_emu_bind {
template <class T> struct slot {
  static T get(void *p) { return (T)p; }
};
template <class T> struct slot<T &> {
  static T &get(void *p) { return *(T *)p; }
};
// A [[buffer(n)]] or [[threadgroup(n)]] argument: a pointer, or a reference to the bound memory.
template <class T> inline T buffer(void *p) { return slot<T>::get(p); }

template <class T> struct pos;
template <> struct pos<uint> { static uint get(const unsigned *v) { return v[0]; } };
template <> struct pos<ushort> { static ushort get(const unsigned *v) { return ushort(v[0]); } };
template <> struct pos<metal::uint2> { static metal::uint2 get(const unsigned *v) { return metal::uint2{v[0], v[1]}; } };
template <> struct pos<metal::uint3> {
  static metal::uint3 get(const unsigned *v) { return metal::uint3{v[0], v[1], v[2]}; }
};
template <> struct pos<metal::ushort2> {
  static metal::ushort2 get(const unsigned *v) { return metal::ushort2{ushort(v[0]), ushort(v[1])}; }
};
template <> struct pos<metal::ushort3> {
  static metal::ushort3 get(const unsigned *v) { return metal::ushort3{ushort(v[0]), ushort(v[1]), ushort(v[2])}; }
};
// A thread-position argument from the thread's value table.
template <class T> inline T position(const unsigned *v) { return pos<T>::get(v); }
} // namespace mlxn_emu_bind

#endif
