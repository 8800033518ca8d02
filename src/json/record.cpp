#include "outbox/pure_tu.h"
#include "outbox/json/record.h"

#include "outbox/common/hex.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>

namespace outbox::json {

std::size_t utf8_char_length(const void *data, std::size_t len, std::size_t i) noexcept {
    const auto *s = static_cast<const unsigned char *>(data);
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

bool is_valid_utf8(const void *data, std::size_t len) {
    for (std::size_t i = 0; i < len;) {
        std::size_t n = utf8_char_length(data, len, i);
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

namespace {

constexpr char kRawBase64Open[] = "{\"raw_base64\": \"";
constexpr char kRawBase64Close[] = "\"}";

// An element of a bytea[] literal: "\\x" and the hex digits, quoted; the
// doubled backslash is the array literal's escape of one.
constexpr char kByteaOpen[] = "\"\\\\x";

}  // namespace

std::size_t raw_base64_json_length(std::size_t len) noexcept {
    return sizeof kRawBase64Open - 1 + base64_length(len) + sizeof kRawBase64Close - 1;
}

void write_raw_base64_json(const void *data, std::size_t len, char *out) noexcept {
    std::memcpy(out, kRawBase64Open, sizeof kRawBase64Open - 1);
    out += sizeof kRawBase64Open - 1;
    base64_encode(data, len, out);
    out += base64_length(len);
    std::memcpy(out, kRawBase64Close, sizeof kRawBase64Close - 1);
}

std::size_t escaped_text_length(const void *data, std::size_t len) noexcept {
    std::size_t out = 0;
    for (std::size_t i = 0; i < len;) {
        std::size_t n = utf8_char_length(data, len, i);
        out += n == 0 ? 4 : n;
        i += n == 0 ? 1 : n;
    }
    return out;
}

void write_escaped_text(const void *data, std::size_t len, char *out) noexcept {
    const auto *s = static_cast<const unsigned char *>(data);
    for (std::size_t i = 0; i < len;) {
        std::size_t n = utf8_char_length(data, len, i);
        if (n == 0) {
            hex::escape(s + i, 1, out);
            out += 4;
            i++;
        } else {
            std::memcpy(out, s + i, n);
            out += n;
            i += n;
        }
    }
}

std::size_t bytea_array_literal_length(const RawHeaders &headers,
                                       const std::vector<bool> &has_value, bool names) noexcept {
    std::size_t out = 2 + (headers.empty() ? 0 : headers.size() - 1);
    for (std::size_t k = 0; k < headers.size(); k++) {
        if (!names && !has_value[k]) {
            out += 4;
            continue;
        }
        const std::string &b = names ? headers[k].first : headers[k].second;
        out += sizeof kByteaOpen - 1 + 2 * b.size() + 1;
    }
    return out;
}

void write_bytea_array_literal(const RawHeaders &headers, const std::vector<bool> &has_value,
                               bool names, char *out) noexcept {
    *out++ = '{';
    for (std::size_t k = 0; k < headers.size(); k++) {
        if (k > 0) *out++ = ',';
        if (!names && !has_value[k]) {
            std::memcpy(out, "NULL", 4);
            out += 4;
            continue;
        }
        const std::string &b = names ? headers[k].first : headers[k].second;
        std::memcpy(out, kByteaOpen, sizeof kByteaOpen - 1);
        out += sizeof kByteaOpen - 1;
        hex::encode(b.data(), b.size(), out);
        out += 2 * b.size();
        *out++ = '"';
    }
    *out = '}';
}

bool is_json_text(const void *data, std::size_t len) {
    return is_valid_utf8(data, len) &&
           nlohmann::json::accept(static_cast<const char *>(data),
                                  static_cast<const char *>(data) + len);
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
