// The extension's one hex table (pure): bytea and uuid digits, \xNN escapes.
#include "outbox/common/hex.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace {

std::string encoded(const std::string &s) {
    std::string out(2 * s.size(), '#');
    outbox::hex::encode(s.data(), s.size(), out.data());
    return out;
}

std::string escaped(const std::string &s) {
    std::string out(4 * s.size(), '#');
    outbox::hex::escape(s.data(), s.size(), out.data());
    return out;
}

}  // namespace

TEST(Hex, LowercaseDigitsOfEveryByte) {
    EXPECT_EQ(encoded(""), "");
    EXPECT_EQ(encoded(std::string("\x00\x0f\x10\x7f\x80\xab\xff", 7)), "000f107f80abff");
    std::string all;
    for (int c = 0; c < 256; c++) all += static_cast<char>(c);
    std::string out = encoded(all);
    for (int c = 0; c < 256; c++) {
        char want[3];
        snprintf(want, sizeof want, "%02x", c);
        EXPECT_EQ(out.substr(2 * c, 2), want);
    }
}

TEST(Hex, EscapesEachByte) {
    EXPECT_EQ(escaped(""), "");
    EXPECT_EQ(escaped(std::string("\x00\xff\"\\", 4)), "\\x00\\xff\\x22\\x5c");
}
