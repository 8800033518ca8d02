// Converting the parts of a consumed Kafka record for the inbox (pure).
#include "outbox/json/record.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

using outbox::json::base64;
using outbox::json::bytes_to_text;
using outbox::json::is_json_text;
using outbox::json::is_uuid_text;
using outbox::json::value_to_json;

TEST(InboxConversion, JsonValuesAreKept) {
    std::string v = R"({"amount": 10, "who": "ü"})";
    EXPECT_EQ(value_to_json(v.data(), v.size(), true), v);
    std::string arr = "[1,2]";
    EXPECT_EQ(value_to_json(arr.data(), arr.size(), true), arr);
    EXPECT_TRUE(is_json_text(v.data(), v.size()));
}

TEST(InboxConversion, TombstoneIsNull) { EXPECT_EQ(value_to_json(nullptr, 0, false), "null"); }

TEST(InboxConversion, AnythingElseIsKeptAsBase64) {
    std::string text = "not json";
    EXPECT_FALSE(is_json_text(text.data(), text.size()));
    auto j = nlohmann::json::parse(value_to_json(text.data(), text.size(), true));
    EXPECT_EQ(j.at("raw_base64"), "bm90IGpzb24=");
    const unsigned char bin[] = {0xff, 0x00, 0x01};
    j = nlohmann::json::parse(value_to_json(bin, sizeof bin, true));
    EXPECT_EQ(j.at("raw_base64"), "/wAB");
    std::string empty;
    j = nlohmann::json::parse(value_to_json(empty.data(), 0, true));
    EXPECT_EQ(j.at("raw_base64"), "");
    // JSON in another encoding than UTF-8 is not JSON for Kafka clients.
    std::string latin1 = "\"Jos\xe9\"";
    EXPECT_FALSE(is_json_text(latin1.data(), latin1.size()));
}

TEST(InboxConversion, Base64OfEveryLength) {
    EXPECT_EQ(base64("", 0), "");
    EXPECT_EQ(base64("f", 1), "Zg==");
    EXPECT_EQ(base64("fo", 2), "Zm8=");
    EXPECT_EQ(base64("foo", 3), "Zm9v");
    EXPECT_EQ(base64("foob", 4), "Zm9vYg==");
    EXPECT_EQ(outbox::json::base64_length(4), 8u);
}

TEST(InboxConversion, BytesBecomeTextWithEscapes) {
    EXPECT_EQ(bytes_to_text("order-1", 7), "order-1");
    EXPECT_EQ(bytes_to_text("\xc3\xbc", 2), "\xc3\xbc");
    EXPECT_EQ(bytes_to_text("a\xff" "b", 3), "a\\xffb");
    EXPECT_EQ(bytes_to_text(std::string("a\0b", 3).data(), 3), "a\\x00b");
    EXPECT_EQ(bytes_to_text("\xed\xa0\x80", 3), "\\xed\\xa0\\x80");  // a surrogate is not UTF-8
}

TEST(InboxConversion, UuidText) {
    EXPECT_TRUE(is_uuid_text("01a23748-1bfd-7e6a-91ca-ce8739afb9df"));
    EXPECT_TRUE(is_uuid_text("01A23748-1BFD-7E6A-91CA-CE8739AFB9DF"));
    EXPECT_FALSE(is_uuid_text("01a237481bfd7e6a91cace8739afb9df"));
    EXPECT_FALSE(is_uuid_text("not-a-uuid"));
    EXPECT_FALSE(is_uuid_text("01a23748-1bfd-7e6a-91ca-ce8739afb9dg"));
}
