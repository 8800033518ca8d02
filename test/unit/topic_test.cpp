#include "outbox/common/topic.h"

#include <gtest/gtest.h>

#include <string>

using outbox::topic_name_error;

TEST(TopicName, AcceptsWhatKafkaAccepts) {
    EXPECT_EQ(topic_name_error("order.events"), nullptr);
    EXPECT_EQ(topic_name_error("a"), nullptr);
    EXPECT_EQ(topic_name_error("A-z_0.9"), nullptr);
    EXPECT_EQ(topic_name_error("..."), nullptr);  // only "." and ".." are reserved
    EXPECT_EQ(topic_name_error(std::string(249, 'x')), nullptr);
}

TEST(TopicName, RejectsEmpty) {
    ASSERT_NE(topic_name_error(""), nullptr);
    EXPECT_NE(std::string(topic_name_error("")).find("empty"), std::string::npos);
}

TEST(TopicName, RejectsTooLong) {
    const char *why = topic_name_error(std::string(250, 'x'));
    ASSERT_NE(why, nullptr);
    EXPECT_NE(std::string(why).find("249"), std::string::npos);
}

TEST(TopicName, RejectsDotAndDotDot) {
    EXPECT_NE(topic_name_error("."), nullptr);
    EXPECT_NE(topic_name_error(".."), nullptr);
}

TEST(TopicName, RejectsCharactersOutsideTheKafkaSet) {
    for (const char *bad : {"order events", "order/events", "ordér", "a:b", "a\nb", "a*", "ä"})
        EXPECT_NE(topic_name_error(bad), nullptr) << bad;
    std::string with_nul("a\0b", 3);
    EXPECT_NE(topic_name_error(with_nul), nullptr);
}
