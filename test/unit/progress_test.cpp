#include "outbox/common/progress.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace progress = outbox::progress;

TEST(Progress, RoundTripsIdsAsRanges) {
    std::string v = progress::encode(42, {7, 3, 4, 5, 9, 10, 100}, 0x0123456789abcdefULL);
    EXPECT_EQ(v, "pg_outbox progress 2 seq=42 digest=0123456789abcdef ids=3-5,7,9-10,100");
    progress::Record r;
    std::string error;
    ASSERT_TRUE(progress::decode(v, r, error)) << error;
    EXPECT_EQ(r.seq, 42);
    EXPECT_EQ(r.ids, (std::vector<int64_t>{3, 4, 5, 7, 9, 10, 100}));
    EXPECT_TRUE(r.has_digest);
    EXPECT_EQ(r.digest, 0x0123456789abcdefULL);
}

TEST(Progress, ReadsFormatOneWithoutADigest) {
    progress::Record r;
    std::string error;
    ASSERT_TRUE(progress::decode("pg_outbox progress 1 seq=7 ids=3-5", r, error)) << error;
    EXPECT_EQ(r.seq, 7);
    EXPECT_EQ(r.ids, (std::vector<int64_t>{3, 4, 5}));
    EXPECT_FALSE(r.has_digest);
}

TEST(Progress, RowDigestsTellMessagesApartWhateverTheirOrder) {
    const char *a = "6f1c7a52-3d0e-4b7e-9a51-0c2f4d8e1b10";
    const char *b = "0b9e2d41-77aa-4c3e-8f01-5e6d7c8b9a21";
    uint64_t ab = progress::row_digest(1, a) + progress::row_digest(2, b);
    uint64_t ba = progress::row_digest(2, b) + progress::row_digest(1, a);
    EXPECT_EQ(ab, ba);
    // The same ids with other messages (a split brain), or the same
    // messages under swapped ids, or one row missing: another digest.
    EXPECT_NE(ab, progress::row_digest(1, b) + progress::row_digest(2, a));
    EXPECT_NE(ab, progress::row_digest(1, "6f1c7a52-3d0e-4b7e-9a51-0c2f4d8e1b11") +
                      progress::row_digest(2, b));
    EXPECT_NE(ab, progress::row_digest(1, a));
    // Fixed across builds and machines: recovery reads records that other
    // builds wrote, so a change of the hash must be a new record format.
    EXPECT_EQ(progress::row_digest(1, a), 0x2c4173c1bd714b44ULL);
}

TEST(Progress, AThousandConsecutiveRowsAreOneRange) {
    std::vector<int64_t> ids;
    for (int64_t i = 1'000'001; i <= 1'001'000; ++i) ids.push_back(i);
    std::string v = progress::encode(1, ids, 0);
    EXPECT_EQ(v, "pg_outbox progress 2 seq=1 digest=0000000000000000 ids=1000001-1001000");
    progress::Record r;
    std::string error;
    ASSERT_TRUE(progress::decode(v, r, error));
    EXPECT_EQ(r.ids, ids);
}

TEST(Progress, EmptyBatchDecodes) {
    progress::Record r;
    std::string error;
    ASSERT_TRUE(progress::decode(progress::encode(3, {}, 5), r, error)) << error;
    EXPECT_EQ(r.seq, 3);
    EXPECT_TRUE(r.ids.empty());
}

TEST(Progress, RefusesWhatIsNotARecord) {
    progress::Record r;
    std::string error;
    for (const char *bad : {"", "hello", "pg_outbox progress 1 seq=0 ids=", "pg_outbox progress 1 seq=x ids=1",
                            "pg_outbox progress 1 seq=1 ids=5,3", "pg_outbox progress 1 seq=1 ids=5-3",
                            "pg_outbox progress 1 seq=1 ids=1,", "pg_outbox progress 1 seq=1 ids=1;2",
                            "pg_outbox progress 1 seq=1 ids=1-99999999999",
                            "pg_outbox progress 2 seq=1 ids=1",
                            "pg_outbox progress 2 seq=1 digest=12 ids=1",
                            "pg_outbox progress 2 seq=1 digest=0123456789abcdeg ids=1",
                            "pg_outbox progress 3 seq=1 ids=1"}) {
        EXPECT_FALSE(progress::decode(bad, r, error)) << bad;
        EXPECT_FALSE(error.empty());
    }
}

TEST(Progress, TransactionalIdsNameTheirShare) {
    std::string prefix = progress::transactional_prefix(7301234567890123456ULL, "shop");
    EXPECT_EQ(prefix, "pg_outbox-7301234567890123456-shop-");
    std::string id = progress::transactional_id(prefix, 2, 4);
    EXPECT_EQ(id, "pg_outbox-7301234567890123456-shop-2of4");
    int share = 0, shares = 0;
    ASSERT_TRUE(progress::parse_transactional_id(id, prefix, share, shares));
    EXPECT_EQ(share, 2);
    EXPECT_EQ(shares, 4);
    EXPECT_FALSE(progress::parse_transactional_id(id, "pg_outbox-1-shop-", share, shares));
    EXPECT_FALSE(progress::parse_transactional_id(prefix + "5of4", prefix, share, shares));
    EXPECT_FALSE(progress::parse_transactional_id(prefix + "1of2x", prefix, share, shares));
    // A database whose name continues the prefix is another database.
    EXPECT_FALSE(progress::parse_transactional_id(
        progress::transactional_id(progress::transactional_prefix(1, "shop-eu"), 1, 1),
        progress::transactional_prefix(1, "shop"), share, shares));
}
