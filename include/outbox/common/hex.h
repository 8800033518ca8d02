// Bytes as lowercase hex digits, the form Postgres prints bytea and uuid
// in: the one hex table of the extension.  Pure C++, noexcept, writing into
// the caller's buffer, so that Postgres-side code can call it on palloc'd
// memory.
#pragma once

#include <cstddef>

namespace outbox::hex {

// Writes the 2 * len hex digits of the bytes to `out` (no terminating NUL).
void encode(const void *data, std::size_t len, char *out) noexcept;

// Writes each byte as the four characters \xNN to `out` (4 * len of them,
// no terminating NUL): how text that cannot hold a byte shows it.
void escape(const void *data, std::size_t len, char *out) noexcept;

}  // namespace outbox::hex
