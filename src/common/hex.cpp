#include "outbox/pure_tu.h"
#include "outbox/common/hex.h"

namespace outbox::hex {

namespace {

constexpr char kDigits[] = "0123456789abcdef";

}  // namespace

void encode(const void *data, std::size_t len, char *out) noexcept {
    const auto *s = static_cast<const unsigned char *>(data);
    for (std::size_t i = 0; i < len; i++) {
        *out++ = kDigits[s[i] >> 4];
        *out++ = kDigits[s[i] & 15];
    }
}

void escape(const void *data, std::size_t len, char *out) noexcept {
    const auto *s = static_cast<const unsigned char *>(data);
    for (std::size_t i = 0; i < len; i++) {
        *out++ = '\\';
        *out++ = 'x';
        encode(s + i, 1, out);
        out += 2;
    }
}

}  // namespace outbox::hex
