// Seed hygiene (docs/serving.md, "Seeds"): a seed nobody gave can be derived
// from a secret instead of drawn from the OS, so the same input gets the same
// seed (and output) again while nobody without the secret can predict it.
//
// Ownership: plain functions. Thread-safety: derive_seed is pure;
// load_seed_secret touches the file system only. Cost: O(tenant + prompt ids).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace encore {

using TokenId = int32_t;

// Reported seeds keep 53 bits: JSON readers that hold numbers as doubles
// (JavaScript) read them back exactly, so they reproduce the output there too.
inline constexpr uint64_t kSeedMask = (uint64_t{1} << 53) - 1;

// A derivation secret has at least this many bytes (HMAC-SHA256's block
// strength needs 32 to be worth its name) and at most kMaxSeedSecretBytes
// (read whole: the size is checked before anything is allocated).
inline constexpr size_t kMinSeedSecretBytes = 32;
inline constexpr size_t kMaxSeedSecretBytes = 4096;

// HMAC-SHA256(secret, "encore-seed-v1" 0x00, u64le(tenant bytes), tenant,
// u64le(ids), ids as int32 little-endian): its first 8 bytes read as a
// little-endian uint64, masked to kSeedMask. Every part is length-prefixed,
// so no two (tenant, ids) pairs encode alike. Throws Error when libcrypto
// fails (it does not for valid input).
uint64_t derive_seed(std::string_view secret, std::string_view tenant,
                     std::span<const TokenId> ids);

// The secret in the file at `path`, for the option named `option` (every
// message names it and the path). A missing file is created with
// kMinSeedSecretBytes random bytes (getrandom), mode 0600, atomically: it is
// written under a temporary name and linked into place, so a concurrent
// reader sees no file or the whole secret, and two processes creating it
// at once both end up with the one that was linked first. Refused with
// InvalidArgument: a file that is not a regular file, one that group or
// others may read or write (chmod 600), one shorter than kMinSeedSecretBytes
// or longer than kMaxSeedSecretBytes, one that cannot be read.
std::string load_seed_secret(const std::string& path, std::string_view option);

// SHA-256 of `bytes`, 64 lowercase hex digits (the audit log's hashes, a
// chat template's). Throws Error when libcrypto fails.
std::string sha256_hex(std::string_view bytes);

}  // namespace encore
