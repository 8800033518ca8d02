#include "outbox/pure_tu.h"
#include "outbox/json/record.h"

#include <nlohmann/json.hpp>

#include <cstdint>

namespace outbox::json {

namespace {

// Length of the valid UTF-8 sequence at s[i], or 0 when it is not one.
std::size_t utf8_sequence(const unsigned char *s, std::size_t len, std::size_t i) {
    unsigned char c = s[i];
    std::size_t n;
    uint32_t cp;
    if (c < 0x80) return c == 0 ? 0 : 1;  // NUL cannot live in a Postgres text
    if ((c & 0xE0) == 0xC0) {
        n = 2;
        cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
        n = 3;
        cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
        n = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (i + n > len) return 0;
    for (std::size_t k = 1; k < n; k++) {
        if ((s[i + k] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
}

}  // namespace

bool is_valid_utf8(const void *data, std::size_t len) {
    const auto *s = static_cast<const unsigned char *>(data);
    for (std::size_t i = 0; i < len;) {
        std::size_t n = utf8_sequence(s, len, i);
        if (n == 0) return false;
        i += n;
    }
    return true;
}

std::size_t base64_length(std::size_t len) noexcept { return (len + 2) / 3 * 4; }

void base64_encode(const void *data, std::size_t len, char *out) noexcept {
    static const char table[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const auto *s = static_cast<const unsigned char *>(data);
    for (std::size_t i = 0; i < len; i += 3) {
        uint32_t v = static_cast<uint32_t>(s[i]) << 16;
        if (i + 1 < len) v |= static_cast<uint32_t>(s[i + 1]) << 8;
        if (i + 2 < len) v |= s[i + 2];
        *out++ = table[(v >> 18) & 63];
        *out++ = table[(v >> 12) & 63];
        *out++ = i + 1 < len ? table[(v >> 6) & 63] : '=';
        *out++ = i + 2 < len ? table[v & 63] : '=';
    }
}

std::string base64(const void *data, std::size_t len) {
    std::string out(base64_length(len), '\0');
    base64_encode(data, len, out.data());
    return out;
}

std::string bytes_to_text(const void *data, std::size_t len) {
    const auto *s = static_cast<const unsigned char *>(data);
    std::string out;
    out.reserve(len);
    for (std::size_t i = 0; i < len;) {
        std::size_t n = utf8_sequence(s, len, i);
        if (n == 0) {
            static const char hex[] = "0123456789abcdef";
            out += "\\x";
            out += hex[s[i] >> 4];
            out += hex[s[i] & 15];
            i++;
        } else {
            out.append(reinterpret_cast<const char *>(s + i), n);
            i += n;
        }
    }
    return out;
}

bool is_json_text(const void *data, std::size_t len) {
    return is_valid_utf8(data, len) &&
           nlohmann::json::accept(static_cast<const char *>(data),
                                  static_cast<const char *>(data) + len);
}

std::string value_to_json(const void *data, std::size_t len, bool present) {
    if (!present) return "null";
    if (is_valid_utf8(data, len) &&
        nlohmann::json::accept(static_cast<const char *>(data), static_cast<const char *>(data) + len))
        return std::string(static_cast<const char *>(data), len);
    return nlohmann::json{{"raw_base64", base64(data, len)}}.dump();
}

bool is_uuid_text(const std::string &s) {
    if (s.size() != 36) return false;
    for (std::size_t i = 0; i < 36; i++) {
        char c = s[i];
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (c != '-') return false;
        } else if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) {
            return false;
        }
    }
    return true;
}

}  // namespace outbox::json
