// The one comma-list parser (outbox.database, outbox.inbox_topics).
#include "outbox/common/list.h"

#include <gtest/gtest.h>

using outbox::parse_name_list;
using outbox::parse_topic_list;
using outbox::split_list;

namespace {

std::vector<std::string> split(const char *text) {
    std::vector<std::string> items;
    std::string error;
    EXPECT_TRUE(split_list(text, items, error)) << text << ": " << error;
    return items;
}

std::string split_error(const char *text) {
    std::vector<std::string> items;
    std::string error;
    EXPECT_FALSE(split_list(text, items, error)) << text;
    return error;
}

}  // namespace

TEST(List, ItemsAreTrimmed) {
    EXPECT_EQ(split("a"), (std::vector<std::string>{"a"}));
    EXPECT_EQ(split(" a ,\tb\t, c d "), (std::vector<std::string>{"a", "b", "c d"}));
}

TEST(List, BlankIsEmpty) {
    EXPECT_TRUE(split("").empty());
    EXPECT_TRUE(split("  \t ").empty());
}

TEST(List, EmptyItemsAreRefusedAndNamed) {
    EXPECT_EQ(split_error("a,,b"), "item 2 of the list is empty");
    EXPECT_EQ(split_error(",a"), "item 1 of the list is empty");
    EXPECT_EQ(split_error("a, "), "item 2 of the list is empty");
    EXPECT_EQ(split_error(","), "item 1 of the list is empty");
}

TEST(NameList, LimitsAndDuplicates) {
    std::vector<std::string> names;
    std::string error;
    EXPECT_TRUE(parse_name_list("app, billing", 16, 63, names, error));
    EXPECT_EQ(names, (std::vector<std::string>{"app", "billing"}));
    EXPECT_FALSE(parse_name_list("", 16, 63, names, error));
    EXPECT_EQ(error, "the list is empty");
    EXPECT_FALSE(parse_name_list("a,b,c", 2, 63, names, error));
    EXPECT_EQ(error, "at most 2 names can be listed");
    EXPECT_FALSE(parse_name_list(std::string(64, 'x'), 16, 63, names, error));
    EXPECT_NE(error.find("longer than 63 bytes"), std::string::npos);
    EXPECT_FALSE(parse_name_list("app, app", 16, 63, names, error));
    EXPECT_EQ(error, "\"app\" is listed twice");
}

TEST(TopicList, EveryTopicIsAKafkaName) {
    std::vector<std::string> topics;
    std::string error;
    EXPECT_TRUE(parse_topic_list("", topics, error));
    EXPECT_TRUE(topics.empty());
    EXPECT_TRUE(parse_topic_list("payments.events, orders_v2", topics, error));
    EXPECT_EQ(topics.size(), 2u);
    EXPECT_FALSE(parse_topic_list("payments, bad topic", topics, error));
    EXPECT_NE(error.find("\"bad topic\""), std::string::npos) << error;
    EXPECT_FALSE(parse_topic_list("a,,b", topics, error));
}
