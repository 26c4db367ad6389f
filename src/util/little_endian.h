// Little-endian integers in byte strings, whatever the host's byte order:
// the encoding of every binary record Encore writes (state store records,
// KV block records). Header-only; pure.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace encore::le {

// Appends the low `n` bytes of v, least significant first.
inline void put(std::string& out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}
inline void put_u16(std::string& out, uint16_t v) { put(out, v, 2); }
inline void put_u32(std::string& out, uint32_t v) { put(out, v, 4); }
inline void put_u64(std::string& out, uint64_t v) { put(out, v, 8); }

// The n-byte little-endian integer at b[at] (the caller checks the bounds).
inline uint64_t get(std::string_view b, size_t at, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i)
    v |= static_cast<uint64_t>(static_cast<uint8_t>(b[at + i])) << (8 * i);
  return v;
}

}  // namespace encore::le
