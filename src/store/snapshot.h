// The bytes of one stored record, the same on disk and in Redis:
//
//   offset size  field (little-endian)
//        0    8  magic "ENCSNAP\n"
//        8    4  format version (kFormatVersion)
//       12    4  header length H (everything before the stored payload)
//       16    8  created, ms since the Unix epoch
//       24    8  expires, ms since the Unix epoch (0: never)
//       32    8  payload length (uncompressed)
//       40    8  stored length (= record length - H)
//       48    1  compression: 0 none, 1 zstd
//       49    3  zero
//       52   16  XXH3-128 of the uncompressed payload (low, high)
//       68       system fingerprint, tenant, name: each u16 length + bytes
//      H-8    8  XXH3-64 of the header bytes before it
//        H       stored payload
//
// decode_record() trusts nothing: every length is checked against the
// record's size and the caller's bound before anything is allocated, the
// header and the payload are checksummed, the zstd frame must declare
// exactly the payload length, and the key must be the one asked for. The
// first failed check names the StoreMiss reason.
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "encore/store.h"

namespace encore::store {

inline constexpr uint32_t kFormatVersion = 1;
inline constexpr size_t kMaxNameBytes = 200;

struct RecordHeader {
  StoreKey key;
  uint64_t created_ms = 0;
  uint64_t expires_ms = 0;  // 0: never
  uint64_t payload_bytes = 0;
  uint64_t stored_bytes = 0;
  uint8_t compression = 0;
  size_t header_bytes = 0;
};

// zstd_level <= 0 stores the payload as it is.
std::string encode_record(const StoreKey& key, std::string_view payload, uint64_t created_ms,
                          uint64_t expires_ms, int zstd_level);

struct Decoded {
  std::optional<std::string> payload;  // set when every check passed
  StoreMiss why = StoreMiss::Corrupt;  // otherwise: the first check that failed
  std::string detail;                  // what exactly, for the log
  RecordHeader header;                 // as far as it was read
};
// expected: the key asked for; now_ms: for the expiry; max_payload: larger
// payloads are TooLarge (nothing allocated for them).
Decoded decode_record(std::string_view bytes, const StoreKey& expected, uint64_t now_ms,
                      uint64_t max_payload);

// The header alone (listings, collection): nullopt and the reason when the
// header itself is not intact. Does not check the payload.
std::optional<RecordHeader> parse_header(std::string_view bytes, StoreMiss* why,
                                         std::string* detail);

// Whether a name may be stored ([A-Za-z0-9_./-], 1..kMaxNameBytes).
bool valid_name(std::string_view name);

// What becomes of a record a tier rejected, for its log line: a KV block
// ("block/...") is recomputed; anything else (a session) is treated as
// absent, and its user decides (a session continued without a prompt fails,
// one with a prompt starts afresh).
inline const char* when_rejected(std::string_view name) {
  return name.rfind("block/", 0) == 0 ? "it will be recomputed" : "treated as absent";
}

// Milliseconds since the Unix epoch now.
uint64_t unix_ms_now();

}  // namespace encore::store
