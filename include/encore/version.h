// Engine version and build id of this binary (encore_buildinfo library).
//
// The build id is part of system_fingerprint (encore/fingerprint.h), which
// promises identical output only under an identical fingerprint. So it must
// never be equal for two builds that could compute different numbers: it is
// strict, at the price of changing far more often than the numerics do.
//
// Covered (cmake/build_id.cmake computes it at every build): SHA-256 over the
// relative path and content of every file under src/, include/, cmake/ and
// the top CMakeLists.txt, plus the compiler id and version, the target
// processor, the build type, CMAKE_CXX_FLAGS (and the build type's flags) and
// the sanitizer/fuzzer options, and the configure-time versions of ICU,
// PCRE2, xxHash and fmt (ICU and PCRE2 take part in tokenisation). Any source
// edit, even a comment, or another compiler gives a new id. Not covered:
// tests/, docs/, scripts/ (not linked into the engine) and the shared
// libraries actually loaded at run time (libc, libm, libstdc++, ICU, PCRE2 may
// differ from the build's; the forward pass uses no libm transcendental, see
// docs/invariance.md).
//
// Cost: returns string literals. Thread-safe.
#pragma once

namespace encore {

// First 16 lowercase hex digits of the build's SHA-256 (see above).
const char* build_id_string();
// PROJECT_VERSION from the top CMakeLists.txt, e.g. "0.1.0".
const char* engine_version_string();

}  // namespace encore
