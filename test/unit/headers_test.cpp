#include "outbox/json/headers.h"

#include <gtest/gtest.h>

using outbox::json::decode_headers;
using outbox::json::has_header;
using outbox::json::Header;

namespace {

std::string decode_error(const char *json) {
    std::vector<Header> out;
    std::string error;
    EXPECT_FALSE(decode_headers(json, out, error)) << json;
    return error;
}

}  // namespace

TEST(Headers, EmptyObjectIsNoHeaders) {
    std::vector<Header> out;
    std::string error;
    ASSERT_TRUE(decode_headers("{}", out, error));
    EXPECT_TRUE(out.empty());
}

TEST(Headers, StringsKeepTheirOrderAndBytes) {
    std::vector<Header> out;
    std::string error;
    ASSERT_TRUE(decode_headers(R"({"event_type": "OrderCreated", "trace": "a\"b", "ü": "ß"})",
                               out, error))
        << error;
    ASSERT_EQ(out.size(), 3u);
    EXPECT_EQ(out[0].name, "event_type");
    EXPECT_EQ(out[0].value, "OrderCreated");
    EXPECT_EQ(out[1].value, "a\"b");
    EXPECT_EQ(out[2].name, "\xc3\xbc");
    EXPECT_EQ(out[2].value, "\xc3\x9f");
}

TEST(Headers, EmptyStringValueIsAHeader) {
    std::vector<Header> out;
    std::string error;
    ASSERT_TRUE(decode_headers(R"({"x": ""})", out, error));
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].value, "");
}

TEST(Headers, NonObjectIsRefused) {
    EXPECT_NE(decode_error("[]").find("an array"), std::string::npos);
    EXPECT_NE(decode_error("\"x\"").find("a string"), std::string::npos);
    EXPECT_NE(decode_error("null").find("null"), std::string::npos);
}

TEST(Headers, NonStringValueNamesTheHeader) {
    std::string e = decode_error(R"({"ok": "1", "retries": 3})");
    EXPECT_NE(e.find("\"retries\""), std::string::npos) << e;
    EXPECT_NE(e.find("a number"), std::string::npos) << e;
    EXPECT_NE(decode_error(R"({"n": null})").find("null"), std::string::npos);
    EXPECT_NE(decode_error(R"({"o": {"a": "b"}})").find("an object"), std::string::npos);
}

TEST(Headers, InvalidJsonIsRefused) {
    EXPECT_NE(decode_error("{\"a\": ").find("not valid JSON"), std::string::npos);
}

TEST(Headers, HasHeader) {
    std::vector<Header> h{{"a", "1"}, {"event_id", "x"}};
    EXPECT_TRUE(has_header(h, "event_id"));
    EXPECT_FALSE(has_header(h, "event"));
    EXPECT_FALSE(has_header({}, "event_id"));
}

TEST(Headers, ANameGivenTwiceKeepsItsPlaceAndItsLastValue) {
    std::vector<Header> back;
    std::string error;
    ASSERT_TRUE(decode_headers(R"({"event_id": "x", "t": "a\"b", "t": "last"})", back, error))
        << error;
    ASSERT_EQ(back.size(), 2u);
    EXPECT_EQ(back[0].name, "event_id");
    EXPECT_EQ(back[1].value, "last");
}
