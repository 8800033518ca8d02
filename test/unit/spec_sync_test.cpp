// The isolation spec must exercise the relay's real claim statement, not a
// look-alike: this test fails when one changes without the other.
#include "outbox/sql_text.h"

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
    std::string spec = read_file(std::string(OUTBOX_SOURCE_DIR) + "/specs/relay_claim.spec");
    ASSERT_FALSE(spec.empty()) << "specs/relay_claim.spec not found";
    EXPECT_NE(spec.find(outbox::sql::kClaim), std::string::npos)
        << "specs/relay_claim.spec must contain outbox::sql::kClaim verbatim";
    EXPECT_NE(spec.find(outbox::sql::kRecordFailures), std::string::npos)
        << "specs/relay_claim.spec must contain outbox::sql::kRecordFailures verbatim";
    EXPECT_NE(spec.find(outbox::sql::kMarkPublished), std::string::npos)
        << "specs/relay_claim.spec must contain outbox::sql::kMarkPublished verbatim";
}
