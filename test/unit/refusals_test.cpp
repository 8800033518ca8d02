#include "outbox/kafka/refusals.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

using outbox::kafka::TopicRefusals;
using Scope = TopicRefusals::Scope;
using namespace std::chrono_literals;

namespace {
const TopicRefusals::Clock::time_point t0{};
}

TEST(TopicRefusals, ATopicRefusalHoldsEveryRecordOfItUntilItsTime) {
    TopicRefusals m;
    std::string why;
    EXPECT_FALSE(m.refused("t", true, 10, why, t0));
    m.note("t", Scope::Topic, 0, "Broker: Topic authorization failed", t0);
    EXPECT_TRUE(m.refused("t", true, 10, why, t0 + 500ms));
    EXPECT_NE(why.find("Topic authorization failed"), std::string::npos) << why;
    EXPECT_NE(why.find("500 ms ago"), std::string::npos) << why;
    EXPECT_TRUE(m.refused("t", false, 0, why, t0 + 999ms));
    EXPECT_FALSE(m.refused("other", true, 10, why, t0 + 500ms));
    EXPECT_FALSE(m.refused("t", true, 10, why, t0 + 1s));
}

TEST(TopicRefusals, ASizeRefusalHoldsOnlyRecordsAsLarge) {
    TopicRefusals m;
    std::string why;
    m.note("small", Scope::Size, 3000, "Broker: Message size too large", t0);
    EXPECT_TRUE(m.refused("small", true, 3000, why, t0));
    EXPECT_TRUE(m.refused("small", true, 5000, why, t0));
    EXPECT_FALSE(m.refused("small", true, 2999, why, t0));
    m.note("small", Scope::Size, 2000, "Broker: Message size too large", t0 + 10ms);
    EXPECT_TRUE(m.refused("small", true, 2000, why, t0 + 20ms));
}

TEST(TopicRefusals, AKeylessRefusalLetsKeyedRecordsGo) {
    TopicRefusals m;
    std::string why;
    m.note("compacted", Scope::Keyless, 10, "Broker: Broker failed to validate record", t0);
    EXPECT_TRUE(m.refused("compacted", false, 10, why, t0));
    EXPECT_FALSE(m.refused("compacted", true, 10, why, t0));
}

TEST(TopicRefusals, RefusedAgainRightAfterItsTimeWaitsTwiceAsLongUpToAMinute) {
    TopicRefusals m;
    std::string why;
    auto t = t0;
    std::chrono::milliseconds period = TopicRefusals::kFirst;
    m.note("t", Scope::Topic, 0, "no", t);
    for (int i = 0; i < 10; i++) {
        EXPECT_TRUE(m.refused("t", true, 1, why, t + period - 1ms)) << i;
        EXPECT_FALSE(m.refused("t", true, 1, why, t + period)) << i;
        t += period + 10ms;  // tried again at once, refused again
        m.note("t", Scope::Topic, 0, "no", t);
        period = std::min(TopicRefusals::kCap, 2 * period);
    }
    EXPECT_EQ(period, TopicRefusals::kCap);
    // A refusal while remembered (records already on their way) changes nothing.
    m.note("t", Scope::Topic, 0, "no", t + 1s);
    EXPECT_FALSE(m.refused("t", true, 1, why, t + period));
    // After a quiet spell, it starts short again.
    t += 10 * period;
    m.note("t", Scope::Topic, 0, "no", t);
    EXPECT_FALSE(m.refused("t", true, 1, why, t + TopicRefusals::kFirst));
}
