#include "outbox/common/said_once.h"

#include <gtest/gtest.h>

#include <string>

using outbox::SaidOnce;

TEST(SaidOnce, SaysEachDistinctTextOnce) {
    SaidOnce said;
    EXPECT_FALSE(said.said_something());
    EXPECT_TRUE(said.first_time("broker down"));
    EXPECT_FALSE(said.first_time("broker down"));
    EXPECT_TRUE(said.first_time("auth failed"));
    EXPECT_TRUE(said.first_time("broker down"));
}

TEST(SaidOnce, ForgetSaysTheSameTextAgain) {
    SaidOnce said;
    EXPECT_TRUE(said.first_time("x"));
    said.forget();
    EXPECT_FALSE(said.said_something());
    EXPECT_TRUE(said.first_time("x"));
}

TEST(SaidOnce, LongTextIsSaidOnce) {
    SaidOnce said;
    std::string long_text(SaidOnce::kCapacity * 2, 'e');
    EXPECT_TRUE(said.first_time(long_text.c_str()));
    EXPECT_FALSE(said.first_time(long_text.c_str()));
    EXPECT_TRUE(said.first_time("short"));
}
