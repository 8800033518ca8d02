#include "outbox/pure_tu.h"
#include "outbox/common/progress.h"

#include <algorithm>
#include <charconv>

namespace outbox::progress {

namespace {

constexpr std::string_view kMagic1 = "pg_outbox progress 1 seq=";
constexpr std::string_view kMagic = "pg_outbox progress 2 seq=";
static_assert(kMagic1.size() == kMagic.size());
constexpr std::size_t kMaxIds = 10'000'000;

bool number(std::string_view &s, int64_t &out) {
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    if (ec != std::errc() || end == s.data()) return false;
    s.remove_prefix(static_cast<std::size_t>(end - s.data()));
    return true;
}

}  // namespace

std::string transactional_prefix(uint64_t system_identifier, std::string_view database) {
    return "pg_outbox-" + std::to_string(system_identifier) + "-" + std::string(database) + "-";
}

std::string transactional_id(std::string_view prefix, int share, int shares) {
    return std::string(prefix) + std::to_string(share) + "of" + std::to_string(shares);
}

bool parse_transactional_id(std::string_view id, std::string_view prefix, int &share,
                            int &shares) {
    if (id.size() <= prefix.size() || id.substr(0, prefix.size()) != prefix) return false;
    std::string_view rest = id.substr(prefix.size());
    int64_t a = 0, b = 0;
    if (!number(rest, a) || rest.substr(0, 2) != "of") return false;
    rest.remove_prefix(2);
    if (!number(rest, b) || !rest.empty() || a < 1 || b < 1 || a > b || b > 1024) return false;
    share = static_cast<int>(a);
    shares = static_cast<int>(b);
    return true;
}

uint64_t row_digest(int64_t id, std::string_view message_id) noexcept {
    // FNV-1a over the id's 8 bytes (little-endian) and the text, then
    // splitmix64's finaliser so that a sum of them spreads over all bits.
    uint64_t h = 14695981039346656037ULL;
    auto add = [&h](unsigned char c) {
        h ^= c;
        h *= 1099511628211ULL;
    };
    uint64_t u = static_cast<uint64_t>(id);
    for (int i = 0; i < 8; ++i) add(static_cast<unsigned char>(u >> (8 * i)));
    for (char c : message_id) add(static_cast<unsigned char>(c));
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebULL;
    h ^= h >> 31;
    return h;
}

std::string encode(int64_t seq, std::vector<int64_t> ids, uint64_t digest) {
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    std::string out(kMagic);
    out += std::to_string(seq);
    char hex[17];
    for (int i = 0; i < 16; ++i) hex[i] = "0123456789abcdef"[(digest >> (60 - 4 * i)) & 0xf];
    hex[16] = '\0';
    out += " digest=";
    out += hex;
    out += " ids=";
    for (std::size_t i = 0; i < ids.size();) {
        std::size_t j = i;
        while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
        if (i > 0) out += ',';
        out += std::to_string(ids[i]);
        if (j > i) {
            out += '-';
            out += std::to_string(ids[j]);
        }
        i = j + 1;
    }
    return out;
}

bool decode(std::string_view value, Record &out, std::string &error) {
    out = Record{};
    bool v2 = value.substr(0, kMagic.size()) == kMagic;
    if (!v2 && value.substr(0, kMagic1.size()) != kMagic1) {
        error = "not a pg outbox progress record";
        return false;
    }
    std::string_view s = value.substr(kMagic.size());  // both magics are as long
    if (!number(s, out.seq) || out.seq < 1) {
        error = "progress record without a valid seq";
        return false;
    }
    if (v2) {
        constexpr std::string_view kDigest = " digest=";
        if (s.substr(0, kDigest.size()) != kDigest || s.size() < kDigest.size() + 16) {
            error = "progress record without a valid digest";
            return false;
        }
        s.remove_prefix(kDigest.size());
        uint64_t d = 0;
        for (int i = 0; i < 16; ++i) {
            char c = s[static_cast<std::size_t>(i)];
            int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
            if (v < 0) {
                error = "progress record without a valid digest";
                return false;
            }
            d = d << 4 | static_cast<uint64_t>(v);
        }
        s.remove_prefix(16);
        out.has_digest = true;
        out.digest = d;
    }
    if (s.substr(0, 5) != " ids=") {
        error = "progress record without a valid seq";
        return false;
    }
    s.remove_prefix(5);
    int64_t last = 0;
    while (!s.empty()) {
        int64_t a = 0, b = 0;
        if (!number(s, a) || a <= last) {
            error = "progress record with ids out of order or unreadable";
            return false;
        }
        b = a;
        if (!s.empty() && s[0] == '-') {
            s.remove_prefix(1);
            if (!number(s, b) || b < a) {
                error = "progress record with an unreadable range";
                return false;
            }
        }
        if (b - a > static_cast<int64_t>(kMaxIds - out.ids.size())) {
            error = "progress record with too many ids";
            return false;
        }
        for (int64_t id = a; id <= b; ++id) out.ids.push_back(id);
        last = b;
        if (!s.empty()) {
            if (s[0] != ',') {
                error = "progress record with an unreadable id list";
                return false;
            }
            s.remove_prefix(1);
            if (s.empty()) {
                error = "progress record ends with a comma";
                return false;
            }
        }
    }
    return true;
}

}  // namespace outbox::progress
