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

namespace {
Required following(bool quorum, int num_sync, std::vector<std::string> members) {
    Required r = parsed("synchronous_standby_names");
    EXPECT_TRUE(r.sync);
    r.rule.quorum = quorum;
    r.rule.num_sync = num_sync;
    r.rule.members = std::move(members);
    return r;
}
}  // namespace

TEST(Standby, FirstNWantsTheConnectedStandbysOfHighestPriority) {
    std::string why;
    Required r = following(false, 1, {"a", "b"});
    // "a" is listed first: "b" holding the batch is not enough while "a" is connected.
    EXPECT_FALSE(hold(r, {{"b", 200}, {"a", 50}}, 100, "flushed", why));
    EXPECT_EQ(why, "synchronous_standby_names wants 1 standby; standby \"a\" has flushed 0/32, "
                   "the batch needs 0/64");
    EXPECT_TRUE(hold(r, {{"b", 50}, {"a", 100}}, 100, "flushed", why));
    // "a" gone: "b" is the synchronous one now, as Postgres would pick it.
    EXPECT_TRUE(hold(r, {{"b", 100}, {"c", 0}}, 100, "flushed", why));
    EXPECT_FALSE(hold(r, {{"c", 500}}, 100, "flushed", why));
    EXPECT_EQ(why, "synchronous_standby_names wants 1 standby; 0 of its standbys are connected");
    // Names compare without regard to case, as Postgres compares them.
    EXPECT_TRUE(hold(following(false, 1, {"Standby1"}), {{"standby1", 100}}, 100, "flushed", why));
    // "*" matches any standby; FIRST 2 wants both of the first two.
    EXPECT_FALSE(hold(following(false, 2, {"*"}), {{"x", 100}, {"y", 99}, {"z", 500}}, 100,
                      "written", why));
    EXPECT_TRUE(hold(following(false, 2, {"*"}), {{"x", 100}, {"y", 100}}, 100, "written", why));
}

TEST(Standby, AnyNWantsThatManyOfItsMembers) {
    std::string why;
    Required r = following(true, 2, {"a", "b", "c"});
    EXPECT_FALSE(hold(r, {{"a", 100}, {"b", 99}, {"c", 10}, {"d", 900}}, 100, "replayed", why));
    EXPECT_EQ(why, "synchronous_standby_names wants any 2 standbys; 1 of its 3 standbys has "
                   "replayed the batch's WAL (0/64)");
    EXPECT_TRUE(hold(r, {{"a", 10}, {"b", 100}, {"c", 100}}, 100, "replayed", why));
    EXPECT_FALSE(hold(r, {{"a", 100}}, 100, "replayed", why));
    EXPECT_EQ(why, "synchronous_standby_names wants any 2 standbys; 1 of its standbys is connected");
}

TEST(Standby, AnEmptySynchronousStandbyNamesWaitsForNothing) {
    std::string why;
    EXPECT_TRUE(hold(following(false, 0, {}), {}, 100, "flushed", why));
    EXPECT_FALSE(parsed("synchronous_standby_names").none());
    EXPECT_EQ(refused("a, synchronous_standby_names"),
              "\"synchronous_standby_names\" cannot be listed beside names");
}
