#include "outbox/kafka/config.h"

#include <gtest/gtest.h>

using outbox::kafka::check_properties;
using outbox::kafka::parse_properties;
using outbox::kafka::Property;

namespace {

std::vector<Property> parse_ok(const char *text) {
    std::vector<Property> out;
    std::string error;
    EXPECT_TRUE(parse_properties(text, out, error)) << text << ": " << error;
    return out;
}

std::string parse_error(const char *text) {
    std::vector<Property> out;
    std::string error;
    EXPECT_FALSE(parse_properties(text, out, error)) << text;
    return error;
}

std::string check_error(const char *text) {
    char err[512] = "";
    EXPECT_FALSE(check_properties(text, err, sizeof err)) << text;
    return err;
}

}  // namespace

TEST(KafkaConfig, EmptyIsNothing) {
    EXPECT_TRUE(parse_ok("").empty());
    EXPECT_TRUE(parse_ok("  ;; ; ").empty());
}

TEST(KafkaConfig, NamesAndValuesInOrder) {
    auto p = parse_ok("linger.ms=5;compression.type=lz4");
    ASSERT_EQ(p.size(), 2u);
    EXPECT_EQ(p[0].name, "linger.ms");
    EXPECT_EQ(p[0].value, "5");
    EXPECT_EQ(p[1].name, "compression.type");
    EXPECT_EQ(p[1].value, "lz4");
}

TEST(KafkaConfig, TrimsWhitespaceAndSkipsEmptySegments) {
    auto p = parse_ok("  security.protocol = SASL_SSL ;; sasl.mechanism=PLAIN ;");
    ASSERT_EQ(p.size(), 2u);
    EXPECT_EQ(p[0].name, "security.protocol");
    EXPECT_EQ(p[0].value, "SASL_SSL");
    EXPECT_EQ(p[1].value, "PLAIN");
}

TEST(KafkaConfig, ValueKeepsLaterEqualsSigns) {
    auto p = parse_ok("sasl.password=a=b==");
    ASSERT_EQ(p.size(), 1u);
    EXPECT_EQ(p[0].value, "a=b==");
}

TEST(KafkaConfig, BackslashEscapesSemicolonBackslashAndSpace) {
    auto p = parse_ok(R"(sasl.password=se\;cr\\et\ ;linger.ms=1)");
    ASSERT_EQ(p.size(), 2u);
    EXPECT_EQ(p[0].value, "se;cr\\et ");  // the escaped trailing space is kept
    EXPECT_EQ(p[1].name, "linger.ms");
}

TEST(KafkaConfig, EmptyValueIsAllowed) {
    auto p = parse_ok("sasl.password=");
    ASSERT_EQ(p.size(), 1u);
    EXPECT_EQ(p[0].value, "");
}

TEST(KafkaConfig, MissingEqualsNamesTheSegment) {
    std::string e = parse_error("linger.ms=5;compression.type");
    EXPECT_NE(e.find("segment 2"), std::string::npos) << e;
    EXPECT_NE(e.find("compression.type"), std::string::npos) << e;
}

TEST(KafkaConfig, EmptyNameIsAnError) {
    EXPECT_NE(parse_error("=5").find("empty property name"), std::string::npos);
}

TEST(KafkaConfig, LoneTrailingBackslashIsAnError) {
    EXPECT_NE(parse_error("a=b\\").find("backslash"), std::string::npos);
}

TEST(KafkaConfig, CheckAcceptsRealProperties) {
    char err[512];
    EXPECT_TRUE(check_properties("", err, sizeof err));
    EXPECT_TRUE(check_properties("linger.ms=5;compression.type=lz4;message.timeout.ms=60000",
                                 err, sizeof err))
        << err;
    EXPECT_TRUE(check_properties("acks=all;enable.idempotence=true", err, sizeof err)) << err;
}

TEST(KafkaConfig, CheckRejectsUnknownPropertyWithLibrdkafkasText) {
    std::string e = check_error("no.such.property=1");
    EXPECT_NE(e.find("no.such.property"), std::string::npos) << e;
}

TEST(KafkaConfig, CheckRejectsBadValue) {
    std::string e = check_error("linger.ms=soon");
    EXPECT_NE(e.find("linger.ms"), std::string::npos) << e;
}

TEST(KafkaConfig, CheckRejectsWhatWouldBreakTheGuarantees) {
    EXPECT_NE(check_error("bootstrap.servers=x:9092").find("outbox.brokers"), std::string::npos);
    EXPECT_NE(check_error("enable.idempotence=false").find("enable.idempotence"),
              std::string::npos);
    EXPECT_NE(check_error("acks=1").find("acks"), std::string::npos);
    EXPECT_NE(check_error("transactional.id=x").find("transactional.id"), std::string::npos);
}

TEST(KafkaConfig, CheckReportsSyntaxErrors) {
    EXPECT_NE(check_error("linger.ms").find("no '='"), std::string::npos);
}
