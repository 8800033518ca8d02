// The isolation spec must exercise the relay's real claim statement, not a
// look-alike: this test fails when one changes without the other.
#include "outbox/queries/inbox_sql.h"
#include "outbox/queries/relay_sql.h"
#include "outbox/queries/retention_sql.h"

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
    EXPECT_NE(spec.find(outbox::sql::relay::kClaim), std::string::npos)
        << "specs/relay_claim.spec must contain outbox::sql::relay::kClaim verbatim";
    EXPECT_NE(spec.find(outbox::sql::relay::kRecordFailures), std::string::npos)
        << "specs/relay_claim.spec must contain outbox::sql::relay::kRecordFailures verbatim";
    EXPECT_NE(spec.find(outbox::sql::relay::kMarkPublished), std::string::npos)
        << "specs/relay_claim.spec must contain outbox::sql::relay::kMarkPublished verbatim";
}

// sql/plans.sql checks the plan of each worker statement: it must run
// the statements themselves.
TEST(SpecSync, PlansTestExplainsTheWorkersStatements) {
    std::string plans = read_file(std::string(OUTBOX_SOURCE_DIR) + "/sql/plans.sql");
    ASSERT_FALSE(plans.empty()) << "sql/plans.sql not found";
    for (const char *sql :
         {outbox::sql::relay::kClaim, outbox::sql::relay::kFirstPending,
          outbox::sql::relay::kMarkClaimedPublished, outbox::sql::relay::kMarkPublished,
          outbox::sql::relay::kMarkClaimedPublishedAt, outbox::sql::relay::kMarkPublishedAt,
          outbox::sql::relay::kRecordFailures, outbox::sql::retention::kRetentionPublished,
          outbox::sql::retention::kFirstIdSince, outbox::sql::retention::kRetentionProcessedEvents,
          outbox::sql::retention::kRetentionInbox, outbox::sql::retention::kStraggler,
          outbox::sql::inbox::kClaim, outbox::sql::inbox::kDone})
        EXPECT_NE(plans.find(sql), std::string::npos) << "sql/plans.sql lacks: " << sql;
}

// sql/hostile.sql runs the handler workers' read of the subscriptions, to
// show which handler they would refuse to run.
TEST(SpecSync, HostileTestRunsTheSubscriptionsRead) {
    std::string hostile = read_file(std::string(OUTBOX_SOURCE_DIR) + "/sql/hostile.sql");
    ASSERT_FALSE(hostile.empty()) << "sql/hostile.sql not found";
    EXPECT_NE(hostile.find(outbox::sql::inbox::kSubscriptions), std::string::npos)
        << "sql/hostile.sql lacks outbox::sql::inbox::kSubscriptions verbatim";
}
