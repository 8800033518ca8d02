// Converting the parts of a consumed Kafka record for the inbox (pure): the
// functions the inbox consumer calls on each record.
#include "outbox/json/record.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

using outbox::json::is_json_text;
using outbox::json::is_uuid_text;
using outbox::json::RawHeaders;

namespace {

// What a length-then-write pair produces, checking that the write fills
// exactly the length it announced (a guard byte after it stays untouched).
template <typename Write>
std::string written(std::size_t len, Write write) {
    std::string buf(len + 1, '#');
    write(buf.data());
    EXPECT_EQ(buf[len], '#') << "written past the announced length";
    buf.resize(len);
    return buf;
}

std::string base64(const std::string &s) {
    return written(outbox::json::base64_length(s.size()),
                   [&](char *out) { outbox::json::base64_encode(s.data(), s.size(), out); });
}

std::string raw_base64_json(const std::string &s) {
    return written(outbox::json::raw_base64_json_length(s.size()), [&](char *out) {
        outbox::json::write_raw_base64_json(s.data(), s.size(), out);
    });
}

std::string escaped_text(const std::string &s) {
    return written(outbox::json::escaped_text_length(s.data(), s.size()),
                   [&](char *out) { outbox::json::write_escaped_text(s.data(), s.size(), out); });
}

std::string literal(const RawHeaders &h, const std::vector<bool> &has_value, bool names) {
    return written(outbox::json::bytea_array_literal_length(h, has_value, names), [&](char *out) {
        outbox::json::write_bytea_array_literal(h, has_value, names, out);
    });
}

const std::string kMegabyte(1 << 20, 'a');

}  // namespace

TEST(InboxConversion, JsonTextIsValidUtf8Json) {
    std::string v = R"({"amount": 10, "who": "ü"})";
    EXPECT_TRUE(is_json_text(v.data(), v.size()));
    std::string arr = "[1,2]";
    EXPECT_TRUE(is_json_text(arr.data(), arr.size()));
    std::string text = "not json";
    EXPECT_FALSE(is_json_text(text.data(), text.size()));
    // JSON in another encoding than UTF-8 is not JSON for Kafka clients.
    std::string latin1 = "\"Jos\xe9\"";
    EXPECT_FALSE(is_json_text(latin1.data(), latin1.size()));
}

TEST(InboxConversion, AnythingElseIsKeptAsBase64) {
    auto j = nlohmann::json::parse(raw_base64_json("not json"));
    EXPECT_EQ(j.at("raw_base64"), "bm90IGpzb24=");
    j = nlohmann::json::parse(raw_base64_json(std::string("\xff\x00\x01", 3)));
    EXPECT_EQ(j.at("raw_base64"), "/wAB");
    j = nlohmann::json::parse(raw_base64_json(""));
    EXPECT_EQ(j.at("raw_base64"), "");
    EXPECT_EQ(raw_base64_json("f"), R"({"raw_base64": "Zg=="})");
    j = nlohmann::json::parse(raw_base64_json(kMegabyte));
    EXPECT_EQ(j.at("raw_base64").get<std::string>(), base64(kMegabyte));
    EXPECT_EQ(j.size(), 1u);
}

TEST(InboxConversion, Base64OfEveryLength) {
    EXPECT_EQ(base64(""), "");
    EXPECT_EQ(base64("f"), "Zg==");
    EXPECT_EQ(base64("fo"), "Zm8=");
    EXPECT_EQ(base64("foo"), "Zm9v");
    EXPECT_EQ(base64("foob"), "Zm9vYg==");
    EXPECT_EQ(outbox::json::base64_length(4), 8u);
    EXPECT_EQ(base64(kMegabyte).size(), outbox::json::base64_length(kMegabyte.size()));
}

TEST(InboxConversion, BytesBecomeTextWithEscapes) {
    EXPECT_EQ(escaped_text("order-1"), "order-1");
    EXPECT_EQ(escaped_text("\xc3\xbc"), "\xc3\xbc");
    EXPECT_EQ(escaped_text("a\xff" "b"), "a\\xffb");
    EXPECT_EQ(escaped_text(std::string("a\0b", 3)), "a\\x00b");
    EXPECT_EQ(escaped_text("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate is not UTF-8
}

TEST(InboxConversion, EscapedTextKeepsQuotesBackslashesAndSize) {
    // Quotes and backslashes are characters: JSON escaping is the caller's.
    EXPECT_EQ(escaped_text("a\"b\\c"), "a\"b\\c");
    EXPECT_EQ(escaped_text(""), "");
    EXPECT_EQ(escaped_text(std::string("\x00\xff", 2)), "\\x00\\xff");
    EXPECT_EQ(escaped_text("\xc3"), "\\xc3");  // a character cut short
    EXPECT_EQ(escaped_text(kMegabyte), kMegabyte);
    EXPECT_EQ(escaped_text(kMegabyte + "\xff"), kMegabyte + "\\xff");
}

TEST(InboxConversion, Utf8CharLength) {
    std::string s = "a\xc3\xbc\xe2\x82\xac\xf0\x9f\x98\x80";
    EXPECT_EQ(outbox::json::utf8_char_length(s.data(), s.size(), 0), 1u);
    EXPECT_EQ(outbox::json::utf8_char_length(s.data(), s.size(), 1), 2u);
    EXPECT_EQ(outbox::json::utf8_char_length(s.data(), s.size(), 3), 3u);
    EXPECT_EQ(outbox::json::utf8_char_length(s.data(), s.size(), 6), 4u);
    EXPECT_EQ(outbox::json::utf8_char_length(s.data(), s.size(), 2), 0u);  // a continuation
    EXPECT_EQ(outbox::json::utf8_char_length(s.data(), 8, 6), 0u);          // cut short
    EXPECT_EQ(outbox::json::utf8_char_length("\0", 1, 0), 0u);
    EXPECT_EQ(outbox::json::utf8_char_length("\xc0\x80", 2, 0), 0u);  // overlong
}

TEST(InboxHeaderArrays, NamesAndValuesInHex) {
    RawHeaders h{{"event_id", "x"}, {"t", "ab"}};
    EXPECT_EQ(literal(h, {true, true}, true), R"({"\\x6576656e745f6964","\\x74"})");
    EXPECT_EQ(literal(h, {true, true}, false), R"({"\\x78","\\x6162"})");
}

TEST(InboxHeaderArrays, NoHeadersIsAnEmptyArray) {
    EXPECT_EQ(literal({}, {}, true), "{}");
    EXPECT_EQ(literal({}, {}, false), "{}");
}

TEST(InboxHeaderArrays, AValueKafkaDidNotCarryIsNull) {
    RawHeaders h{{"a", ""}, {"b", ""}, {"c", "z"}};
    std::vector<bool> has{false, true, false};
    EXPECT_EQ(literal(h, has, false), R"({NULL,"\\x",NULL})");
    // A name always has its bytes, even where the value is NULL.
    EXPECT_EQ(literal(h, has, true), R"({"\\x61","\\x62","\\x63"})");
}

TEST(InboxHeaderArrays, QuotesBackslashesAndEveryByteGoAsHex) {
    RawHeaders h{{"q\"", std::string("\\,{}\x00\xff", 6)}};
    EXPECT_EQ(literal(h, {true}, true), R"({"\\x7122"})");
    EXPECT_EQ(literal(h, {true}, false), R"({"\\x5c2c7b7d00ff"})");
    EXPECT_EQ(literal({{"NULL", "NULL"}}, {true}, false), R"({"\\x4e554c4c"})");
}

TEST(InboxHeaderArrays, AMegabyteValue) {
    std::string hex;
    for (std::size_t i = 0; i < kMegabyte.size(); i++) hex += "61";
    EXPECT_EQ(literal({{"big", kMegabyte}}, {true}, false), "{\"\\\\x" + hex + "\"}");
}

TEST(InboxConversion, UuidText) {
    EXPECT_TRUE(is_uuid_text("01a23748-1bfd-7e6a-91ca-ce8739afb9df"));
    EXPECT_TRUE(is_uuid_text("01A23748-1BFD-7E6A-91CA-CE8739AFB9DF"));
    EXPECT_FALSE(is_uuid_text("01a237481bfd7e6a91cace8739afb9df"));
    EXPECT_FALSE(is_uuid_text("not-a-uuid"));
    EXPECT_FALSE(is_uuid_text("01a23748-1bfd-7e6a-91ca-ce8739afb9dg"));
}
