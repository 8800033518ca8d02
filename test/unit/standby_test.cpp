// outbox.wait_for_standbys: its parser and the rule that decides whether a
// batch may go to Kafka (the relay calls exactly these).
#include "outbox/common/standby.h"

#include <gtest/gtest.h>

using outbox::standby::hold;
using outbox::standby::parse;
using outbox::standby::Required;
using outbox::standby::Standby;

namespace {

Required parsed(const char *text) {
    Required r;
    std::string error;
    EXPECT_TRUE(parse(text, r, error)) << text << ": " << error;
    return r;
}

std::string refused(const char *text) {
    Required r;
    std::string error;
    EXPECT_FALSE(parse(text, r, error)) << text;
    return error;
}

}  // namespace

TEST(Standby, EmptyAsksForNothing) {
    EXPECT_TRUE(parsed("").none());
    EXPECT_TRUE(parsed("  ").none());
    std::string why;
    EXPECT_TRUE(hold(parsed(""), {}, 100, "flushed", why));
}

TEST(Standby, StarIsAnyOneStandby) {
    Required r = parsed(" * ");
    EXPECT_TRUE(r.any);
    std::string why;
    EXPECT_FALSE(hold(r, {}, 100, "flushed", why));
    EXPECT_EQ(why, "no standby is connected");
    EXPECT_FALSE(hold(r, {{"a", 99}, {"b", 50}}, 100, "flushed", why));
    EXPECT_NE(why.find("\"a\", has flushed 0/63, the batch needs 0/64"), std::string::npos) << why;
    EXPECT_TRUE(hold(r, {{"a", 99}, {"b", 100}}, 100, "flushed", why));
}

TEST(Standby, EveryNamedStandbyMustHoldIt) {
    Required r = parsed("a, b");
    EXPECT_EQ(r.names, (std::vector<std::string>{"a", "b"}));
    std::string why;
    EXPECT_FALSE(hold(r, {{"a", 200}}, 100, "replayed", why));
    EXPECT_EQ(why, "standby \"b\" is not connected");
    EXPECT_FALSE(hold(r, {{"a", 0x100000020ull}, {"b", 0x100000000ull}}, 0x100000010ull, "replayed", why));
    EXPECT_EQ(why, "standby \"b\" has replayed 1/0, the batch needs 1/10");
    EXPECT_TRUE(hold(r, {{"a", 200}, {"b", 100}, {"c", 0}}, 100, "replayed", why));
    // Two walsenders with one name (a standby reconnecting): the furthest counts.
    EXPECT_TRUE(hold(r, {{"a", 100}, {"b", 5}, {"b", 100}}, 100, "replayed", why));
}

TEST(Standby, NamesAreCaseSensitiveLikeApplicationName) {
    std::string why;
    EXPECT_FALSE(hold(parsed("Standby1"), {{"standby1", 500}}, 100, "flushed", why));
}

TEST(Standby, BadListsAreRefusedWithAReason) {
    EXPECT_EQ(refused("a,*"), "\"*\" (any standby) cannot be listed beside names");
    EXPECT_EQ(refused("a,,b"), "item 2 of the list is empty");
    EXPECT_EQ(refused("a,a"), "\"a\" is listed twice");
    EXPECT_NE(refused(std::string(64, 'x').c_str()).find("longer than 63 bytes"),
              std::string::npos);
}
