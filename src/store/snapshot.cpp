#include "store/snapshot.h"
#include "util/little_endian.h"

#include <fmt/format.h>
#include <xxhash.h>
#include <zstd.h>

#include <chrono>
#include <cstring>

namespace encore::store {
namespace {

constexpr char kMagic[8] = {'E', 'N', 'C', 'S', 'N', 'A', 'P', '\n'};
constexpr size_t kFixedBytes = 68;            // up to the strings
constexpr size_t kMaxHeaderBytes = 1u << 16;  // three u16 strings + fixed part fit easily

void put_str(std::string& out, std::string_view s) {
  le::put_u16(out, static_cast<uint16_t>(s.size()));
  out.append(s);
}

Decoded miss(StoreMiss why, std::string detail, RecordHeader h = {}) {
  Decoded d;
  d.why = why;
  d.detail = std::move(detail);
  d.header = std::move(h);
  return d;
}

}  // namespace

bool valid_name(std::string_view name) {
  if (name.empty() || name.size() > kMaxNameBytes) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '/' || c == '-';
    if (!ok) return false;
  }
  return true;
}

uint64_t unix_ms_now() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

std::string encode_record(const StoreKey& key, std::string_view payload, uint64_t created_ms,
                          uint64_t expires_ms, int zstd_level) {
  std::string stored;
  uint8_t compression = 0;
  if (zstd_level > 0) {
    stored.resize(ZSTD_compressBound(payload.size()));
    const size_t n =
        ZSTD_compress(stored.data(), stored.size(), payload.data(), payload.size(), zstd_level);
    if (!ZSTD_isError(n) && n < payload.size()) {
      stored.resize(n);
      compression = 1;
    }
  }
  if (compression == 0) stored.assign(payload);  // incompressible: kept as it is
  const XXH128_hash_t h = XXH3_128bits(payload.data(), payload.size());
  std::string out(kMagic, sizeof kMagic);
  le::put_u32(out, kFormatVersion);
  const size_t header_bytes =
      kFixedBytes + 6 + key.system_fingerprint.size() + key.tenant.size() + key.name.size() + 8;
  le::put_u32(out, static_cast<uint32_t>(header_bytes));
  le::put_u64(out, created_ms);
  le::put_u64(out, expires_ms);
  le::put_u64(out, payload.size());
  le::put_u64(out, stored.size());
  out.push_back(static_cast<char>(compression));
  out.append(3, '\0');
  le::put_u64(out, h.low64);
  le::put_u64(out, h.high64);
  put_str(out, key.system_fingerprint);
  put_str(out, key.tenant);
  put_str(out, key.name);
  le::put_u64(out, XXH3_64bits(out.data(), out.size()));
  out += stored;
  return out;
}

std::optional<RecordHeader> parse_header(std::string_view b, StoreMiss* why, std::string* detail) {
  auto fail = [&](StoreMiss w, std::string d) -> std::optional<RecordHeader> {
    *why = w;
    *detail = std::move(d);
    return std::nullopt;
  };
  if (b.size() < 16) return fail(StoreMiss::Truncated, fmt::format("{} bytes", b.size()));
  if (std::memcmp(b.data(), kMagic, sizeof kMagic) != 0) {
    return fail(StoreMiss::Corrupt, "not a snapshot record (bad magic)");
  }
  const auto version = static_cast<uint32_t>(le::get(b, 8, 4));
  if (version != kFormatVersion) {
    return fail(StoreMiss::Version,
                fmt::format("format version {} (this build reads {})", version, kFormatVersion));
  }
  const size_t header_bytes = le::get(b, 12, 4);
  if (header_bytes < kFixedBytes + 6 + 8 || header_bytes > kMaxHeaderBytes) {
    return fail(StoreMiss::Corrupt, fmt::format("header length {}", header_bytes));
  }
  if (header_bytes > b.size()) {
    return fail(StoreMiss::Truncated,
                fmt::format("{} bytes, the header alone has {}", b.size(), header_bytes));
  }
  if (le::get(b, header_bytes - 8, 8) != XXH3_64bits(b.data(), header_bytes - 8)) {
    return fail(StoreMiss::Corrupt, "header checksum mismatch");
  }
  RecordHeader h;
  h.header_bytes = header_bytes;
  h.created_ms = le::get(b, 16, 8);
  h.expires_ms = le::get(b, 24, 8);
  h.payload_bytes = le::get(b, 32, 8);
  h.stored_bytes = le::get(b, 40, 8);
  h.compression = static_cast<uint8_t>(b[48]);
  size_t at = kFixedBytes;
  for (std::string* s : {&h.key.system_fingerprint, &h.key.tenant, &h.key.name}) {
    if (at + 2 > header_bytes - 8) return fail(StoreMiss::Corrupt, "header strings overrun");
    const size_t n = le::get(b, at, 2);
    at += 2;
    if (at + n > header_bytes - 8) return fail(StoreMiss::Corrupt, "header strings overrun");
    s->assign(b.substr(at, n));
    at += n;
  }
  if (at != header_bytes - 8) return fail(StoreMiss::Corrupt, "header length mismatch");
  if (h.compression > 1) {
    return fail(StoreMiss::Corrupt, fmt::format("compression {}", int{h.compression}));
  }
  return h;
}

Decoded decode_record(std::string_view b, const StoreKey& expected, uint64_t now_ms,
                      uint64_t max_payload) {
  StoreMiss why = StoreMiss::Corrupt;
  std::string detail;
  std::optional<RecordHeader> parsed = parse_header(b, &why, &detail);
  if (!parsed) return miss(why, detail);
  const RecordHeader& h = *parsed;
  const uint64_t have = b.size() - h.header_bytes;
  if (h.stored_bytes > have) {
    return miss(StoreMiss::Truncated,
                fmt::format("payload: {} of {} stored bytes", have, h.stored_bytes), h);
  }
  if (h.stored_bytes < have) {
    return miss(StoreMiss::Corrupt,
                fmt::format("{} bytes after the payload", have - h.stored_bytes), h);
  }
  if (h.payload_bytes > max_payload || h.stored_bytes > max_payload) {
    return miss(StoreMiss::TooLarge,
                fmt::format("payload of {} bytes (at most {})", h.payload_bytes, max_payload), h);
  }
  const std::string_view stored = b.substr(h.header_bytes);
  std::string payload;
  if (h.compression == 0) {
    if (h.stored_bytes != h.payload_bytes) {
      return miss(StoreMiss::Corrupt, "uncompressed payload of the wrong length", h);
    }
    payload.assign(stored);
  } else {
    const unsigned long long declared = ZSTD_getFrameContentSize(stored.data(), stored.size());
    if (declared != h.payload_bytes) {
      return miss(StoreMiss::Corrupt, "compressed frame of the wrong length", h);
    }
    payload.resize(h.payload_bytes);
    const size_t n = ZSTD_decompress(payload.data(), payload.size(), stored.data(), stored.size());
    if (ZSTD_isError(n) || n != h.payload_bytes) {
      return miss(StoreMiss::Corrupt,
                  fmt::format("zstd: {}", ZSTD_isError(n) ? ZSTD_getErrorName(n) : "short"), h);
    }
  }
  const XXH128_hash_t sum = XXH3_128bits(payload.data(), payload.size());
  if (sum.low64 != le::get(b, 52, 8) || sum.high64 != le::get(b, 60, 8)) {
    return miss(StoreMiss::Corrupt, "payload checksum mismatch", h);
  }
  if (h.key.system_fingerprint != expected.system_fingerprint) {
    return miss(StoreMiss::Fingerprint,
                fmt::format("made under {} (this engine: {})", h.key.system_fingerprint,
                            expected.system_fingerprint),
                h);
  }
  if (h.key.tenant != expected.tenant) return miss(StoreMiss::Tenant, "another tenant's", h);
  if (h.key.name != expected.name) {
    return miss(StoreMiss::Key, fmt::format("holds {} instead", h.key.name), h);
  }
  if (h.expires_ms != 0 && h.expires_ms <= now_ms) {
    return miss(StoreMiss::Expired, fmt::format("expired {} ms ago", now_ms - h.expires_ms), h);
  }
  Decoded d;
  d.payload = std::move(payload);
  d.header = h;
  return d;
}

}  // namespace encore::store
