// libFuzzer target for stored records (src/store/snapshot.h): bytes from a
// disk file or a Redis value are untrusted. decode_record must never crash,
// never allocate beyond its bound, and accept only records whose payload
// re-encodes to a record that decodes to the same payload. Anything else
// (crash, sanitizer report, an exception, a hang) is a bug.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "store/snapshot.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

const encore::StoreKey kKey{"fp_0123456789abcdef0123456789abcdef", "tenant", "block/0"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const encore::store::Decoded d = encore::store::decode_record(bytes, kKey, 1000, 1 << 20);
  encore::StoreMiss why{};
  std::string detail;
  (void)encore::store::parse_header(bytes, &why, &detail);
  if (!d.payload) return 0;
  check(d.payload->size() <= (1u << 20));
  check(d.header.key == kKey);
  const std::string again = encore::store::encode_record(kKey, *d.payload, 1, 0, 1);
  const encore::store::Decoded back = encore::store::decode_record(again, kKey, 1000, 1 << 20);
  check(back.payload.has_value() && *back.payload == *d.payload);
  return 0;
}
