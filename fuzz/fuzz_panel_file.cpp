// libFuzzer target for panel cache file headers (src/model/panel_file.h):
// a file in the cache directory is untrusted. The parser must never crash
// or read out of bounds; an accepted header must describe panels inside the
// file and encode back to the same bytes. Each input is parsed as a whole
// file, and again as the first bytes of a file of the size it claims, with
// and without its digest check (so mutations reach the checks behind it).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "model/panel_file.h"
#include "util/little_endian.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

void parse(std::string_view bytes, uint64_t file_bytes, bool verify) {
  std::string why;
  const auto h = encore::decode_panel_file_header(bytes, file_bytes, &why, verify);
  if (!h) {
    check(!why.empty());
    return;
  }
  check(h->header_bytes + h->panel_bytes == file_bytes);
  for (const auto& m : h->matrices) {
    check(m.m.offset <= h->panel_bytes && m.m.bytes <= h->panel_bytes - m.m.offset);
  }
  if (!verify) return;
  const std::string again = encore::encode_panel_file_header(*h);
  check(again.size() == h->header_bytes && bytes.substr(0, again.size()) == again);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  for (bool verify : {true, false}) {
    parse(bytes, size, verify);
    if (size >= 40) {
      const uint64_t claimed = encore::le::get(bytes, 24, 8) + encore::le::get(bytes, 32, 8);
      parse(bytes, claimed, verify);
    }
  }
  return 0;
}
