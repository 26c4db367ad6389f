// The API key file (src/server/auth.h): state_mib=N gives the key's tenant a
// share of the state tiers; bad values and tenants whose keys disagree are
// errors naming the line.
#include "server/auth.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "cli_runner.h"
#include "encore/error.h"

namespace encore::server {
namespace {

ApiKeys load(const std::string& text) {
  test::TempDir d;
  std::ofstream(d.file("keys")) << text;
  return load_api_keys(d.file("keys"));
}

std::string error_of(const std::string& text) {
  try {
    load(text);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(ApiKeys, StateMibGivesTheTenantAShare) {
  const ApiKeys keys = load(
      "key-aaaaaaaa alice state_mib=64 max_in_flight=2\n"
      "key-bbbbbbbb alice state_mib=64  # the same tenant may repeat it\n"
      "key-cccccccc bob\n"
      "key-dddddddd carol state_mib=1 revoked\n");
  EXPECT_EQ(keys.at("key-aaaaaaaa").state_bytes, 64ull << 20);
  EXPECT_EQ(keys.at("key-aaaaaaaa").max_in_flight, 2);
  EXPECT_EQ(keys.at("key-cccccccc").state_bytes, 0u) << "no share of its own by default";
  EXPECT_TRUE(keys.at("key-dddddddd").revoked);
  const std::map<std::string, uint64_t> shares = tenant_state_bytes(keys);
  EXPECT_EQ(shares, (std::map<std::string, uint64_t>{{"alice", 64ull << 20}, {"carol", 1 << 20}}));
}

TEST(ApiKeys, BadSharesAreErrorsNamingTheLine) {
  for (const char* bad : {"state_mib=0", "state_mib=", "state_mib=-1", "state_mib=1.5",
                          "state_mib=12345678", "state_mib=x"}) {
    const std::string e = error_of(std::string("# comment\nkey-aaaaaaaa alice ") + bad + "\n");
    EXPECT_NE(e.find("line 2: state_mib must be a number of MiB"), std::string::npos)
        << bad << ": " << e;
  }
  const std::string e = error_of(
      "key-aaaaaaaa alice state_mib=64\n"
      "key-bbbbbbbb alice state_mib=32\n");
  EXPECT_NE(e.find("line 2: state_mib=32 but line 1 gives tenant alice state_mib=64"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("[state_mib=N]"), std::string::npos) << "the format is told: " << e;
}

}  // namespace
}  // namespace encore::server
