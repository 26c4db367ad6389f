// Buffers that are streamed through at memory speed (weights read into
// memory, the bandwidth probe): 2 MiB aligned and advised to use
// transparent huge pages, so reading them costs 512 times fewer page faults
// and TLB misses. The advice is only advice: where the kernel has no huge
// pages the buffer is an ordinary one.
// Thread-safety: reentrant.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>

namespace encore::util {

inline constexpr size_t kHugePage = size_t{2} << 20;

// `size` bytes (> 0), or nullptr when memory is short. Free with std::free.
inline void* alloc_huge_pages(size_t size) {
  void* p = nullptr;
  if (::posix_memalign(&p, kHugePage, size) != 0) return nullptr;
  ::madvise(p, size / kHugePage * kHugePage, MADV_HUGEPAGE);  // the whole huge pages inside
  return p;
}

}  // namespace encore::util
