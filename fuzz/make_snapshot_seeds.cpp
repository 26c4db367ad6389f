// Writes a few valid stored records (compressed, uncompressed, empty) into
// the folder given as argv[1]: the seed corpus of fuzz_snapshot.
#include <cstdio>
#include <fstream>
#include <string>

#include "store/snapshot.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const encore::StoreKey key{"fp_0123456789abcdef0123456789abcdef", "tenant", "block/0"};
  std::string text;
  for (int i = 0; i < 300; ++i) text += "once upon a time ";
  std::string noise(700, '\0');
  for (size_t i = 0; i < noise.size(); ++i) noise[i] = static_cast<char>(i * 2654435761u >> 13);
  const std::string records[] = {
      encore::store::encode_record(key, text, 1, 0, 3),
      encore::store::encode_record(key, noise, 1, 0, 0),
      encore::store::encode_record(key, "", 1, 5000, 1),
  };
  for (size_t i = 0; i < 3; ++i) {
    std::ofstream(std::string(argv[1]) + "/seed-" + std::to_string(i), std::ios::binary)
        << records[i];
  }
  return 0;
}
