// Converting the parts of a consumed Kafka record into what the inbox
// stores: text that is valid UTF-8, a value as JSON, headers as bytea[]
// literals.  Pure C++.  The functions that write into the caller's buffer
// (a length function, then a write function) are noexcept, so that the
// inbox consumer calls them on palloc'd memory; the others may throw
// std::bad_alloc (callers catch it).
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace outbox::json {

// Whether the bytes are valid UTF-8 without NUL (which no Postgres text can
// hold).
bool is_valid_utf8(const void *data, std::size_t len);

// The length of the UTF-8 character at data[i], or 0 when the byte there
// does not start one (or is NUL, which no Postgres text can hold).
std::size_t utf8_char_length(const void *data, std::size_t len, std::size_t i) noexcept;

// The bytes as UTF-8 text: valid characters kept, any other byte written as
// \xNN, so that nothing is lost and the text is always valid.  What a key
// or header becomes in the inbox of a UTF-8 database.
std::size_t escaped_text_length(const void *data, std::size_t len) noexcept;
void write_escaped_text(const void *data, std::size_t len, char *out) noexcept;

// Whether the bytes are valid UTF-8 JSON text (of any JSON value).
bool is_json_text(const void *data, std::size_t len);

// Standard base64 (RFC 4648, with padding): base64_length(len) characters
// written to `out` (no terminating NUL).
std::size_t base64_length(std::size_t len) noexcept;
void base64_encode(const void *data, std::size_t len, char *out) noexcept;

// The JSON object {"raw_base64": "..."}: what the inbox stores as the
// payload of a value that is not JSON (or holds a character the database's
// encoding lacks), so that no record is ever dropped.  No terminating NUL.
std::size_t raw_base64_json_length(std::size_t len) noexcept;
void write_raw_base64_json(const void *data, std::size_t len, char *out) noexcept;

// The text of a bytea[] array literal of the headers' names (`names`) or
// values, each element in hex: the inbox stores each record's headers as
// one array, whatever their bytes.  A header Kafka carried without a value
// (has_value[k] false) has NULL there; a name always has bytes.  No
// terminating NUL.
using RawHeaders = std::vector<std::pair<std::string, std::string>>;
std::size_t bytea_array_literal_length(const RawHeaders &headers,
                                       const std::vector<bool> &has_value, bool names) noexcept;
void write_bytea_array_literal(const RawHeaders &headers, const std::vector<bool> &has_value,
                               bool names, char *out) noexcept;

// Whether `s` is a UUID in its 8-4-4-4-12 text form (either case).
bool is_uuid_text(const std::string &s);

}  // namespace outbox::json
