#include "outbox/common/low_water.h"

#include <gtest/gtest.h>

using outbox::low_water::Announcement;
using outbox::low_water::kNone;
using outbox::low_water::Mark;
using outbox::low_water::next_scan_in_ms;

TEST(LowWaterMark, StartsAtTheBeginning) { EXPECT_EQ(Mark().value(), 0); }

// Where a turn's end leaves the mark.  A row found pending was assigned
// before or after the sequence was read; the mark never passes an id
// assigned after the read.
TEST(LowWaterMark, AdvancesToTheFirstPendingRowButNeverPastTheNextId) {
    const struct {
        int64_t first_pending, next_id, mark;
    } cases[] = {
        {42, 100, 42},   // the first row a claim may take
        {-1, 100, 100},  // nothing pending: the next id
        {150, 100, 100}, // pending beyond the sequence read: no further than it
        {-1, -5, 0},     // never below the start
    };
    for (const auto &c : cases) {
        Mark m;
        m.advance(c.first_pending, c.next_id);
        EXPECT_EQ(m.value(), c.mark) << c.first_pending << " " << c.next_id;
    }
}

TEST(LowWaterMark, AdvanceMayMoveItDown) {
    Mark m;
    m.advance(-1, 100);
    m.advance(7, 100);
    EXPECT_EQ(m.value(), 7);
}

TEST(LowWaterMark, LowersOnlyDownward) {
    Mark m;
    m.advance(-1, 100);
    m.lower_to(120);
    EXPECT_EQ(m.value(), 100);
    m.lower_to(30);
    EXPECT_EQ(m.value(), 30);
    m.lower_to(kNone);
    EXPECT_EQ(m.value(), 30);
}

TEST(LowWaterAnnouncement, KeepsTheLowestIdUntilTaken) {
    Announcement a;
    EXPECT_EQ(a.take(), -1);
    a.wrote(12);
    a.wrote(9);
    a.wrote(15);
    EXPECT_EQ(a.take(), 9);
    EXPECT_EQ(a.take(), -1);
}

TEST(LowWaterAnnouncement, IdZeroCounts) {
    Announcement a;
    a.wrote(0);
    a.wrote(3);
    EXPECT_EQ(a.take(), 0);
}

TEST(StragglerScan, WaitsAtLeastThePollInterval) { EXPECT_EQ(next_scan_in_ms(1000, 2, 50), 1000); }

TEST(StragglerScan, SpendsAtMostItsShareOfTheTime) {
    EXPECT_EQ(next_scan_in_ms(1000, 100, 50), 5000);
}
