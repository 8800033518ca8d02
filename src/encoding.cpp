#include "outbox/common/hex.h"
#include "outbox/json/record.h"

#include "outbox/encoding.h"

extern "C" {
#include "catalog/namespace.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
}

namespace {

// Converts `len` bytes from encoding `from` to `to` with `proc`; nullptr
// when some character has no place in `to` (the conversion stops there).
char *convert(Oid proc, int from, int to, const char *s, std::size_t len) {
    int ilen = static_cast<int>(len);
    Size room = len * MAX_CONVERSION_GROWTH + 1;
    auto *out = static_cast<unsigned char *>(palloc(room));
    int done = pg_do_encoding_conversion_buf(
        proc, from, to, reinterpret_cast<unsigned char *>(const_cast<char *>(s)), ilen, out,
        static_cast<int>(room), true);
    return done == ilen ? reinterpret_cast<char *>(out) : nullptr;
}

// A UTF-8 database needs no conversion; SQL_ASCII has no encoding to
// convert from or to, so its bytes are taken as they are.
bool converts_nothing(int enc) { return enc == PG_UTF8 || enc == PG_SQL_ASCII; }

}  // namespace

char *outbox_encoding_from_utf8(const char *utf8, std::size_t len) {
    if (memchr(utf8, '\0', len) || !pg_verify_mbstr(PG_UTF8, utf8, static_cast<int>(len), true))
        return nullptr;
    int enc = GetDatabaseEncoding();
    if (converts_nothing(enc)) return pnstrdup(utf8, len);
    Oid proc = FindDefaultConversionProc(PG_UTF8, enc);
    if (!OidIsValid(proc)) return nullptr;
    return convert(proc, PG_UTF8, enc, utf8, len);
}

char *outbox_encoding_from_utf8_escaped(const char *utf8, std::size_t len) {
    if (char *whole = outbox_encoding_from_utf8(utf8, len)) return whole;
    if (converts_nothing(GetDatabaseEncoding())) {
        // Every UTF-8 character has its place: only the other bytes are
        // escaped.
        std::size_t n = outbox::json::escaped_text_length(utf8, len);
        auto *out = static_cast<char *>(palloc(n + 1));
        outbox::json::write_escaped_text(utf8, len, out);
        out[n] = '\0';
        return out;
    }
    // Character by character: those the encoding has are converted.
    StringInfoData out;
    initStringInfo(&out);
    for (std::size_t i = 0; i < len;) {
        std::size_t n = outbox::json::utf8_char_length(utf8, len, i);
        char *one = n > 0 ? outbox_encoding_from_utf8(utf8 + i, n) : nullptr;
        if (n == 0) n = 1;
        if (one) {
            appendStringInfoString(&out, one);
        } else {
            enlargeStringInfo(&out, static_cast<int>(4 * n));
            outbox::hex::escape(utf8 + i, n, out.data + out.len);
            out.len += static_cast<int>(4 * n);
            out.data[out.len] = '\0';
        }
        i += n;
    }
    return out.data;
}

const char *outbox_encoding_to_utf8(const char *s, std::size_t *len) {
    int enc = GetDatabaseEncoding();
    if (converts_nothing(enc) || *len == 0) return s;
    static Oid proc = InvalidOid;
    if (!OidIsValid(proc)) proc = FindDefaultConversionProc(enc, PG_UTF8);
    if (!OidIsValid(proc)) return nullptr;
    char *out = convert(proc, enc, PG_UTF8, s, *len);
    if (out) *len = strlen(out);
    return out;
}
