// The isolation spec must exercise the relay's real claim statement, not a
// look-alike: this test fails when one changes without the other.
#include "outbox/queries/relay_sql.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace {

std::string read_file(const std::string &path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

}  // namespace

TEST(SpecSync, RelayClaimSpecRunsTheRelaysStatements) {
    std::string spec = read_file(std::string(OUTBOX_SOURCE_DIR) + "/test/specs/relay_claim.spec");
    ASSERT_FALSE(spec.empty()) << "test/specs/relay_claim.spec not found";
    EXPECT_NE(spec.find(outbox::sql::relay::kClaim), std::string::npos)
        << "test/specs/relay_claim.spec must contain outbox::sql::relay::kClaim verbatim";
    EXPECT_NE(spec.find(outbox::sql::relay::kRecordFailures), std::string::npos)
        << "test/specs/relay_claim.spec must contain outbox::sql::relay::kRecordFailures verbatim";
    EXPECT_NE(spec.find(outbox::sql::relay::kMarkPublished), std::string::npos)
        << "test/specs/relay_claim.spec must contain outbox::sql::relay::kMarkPublished verbatim";
}
