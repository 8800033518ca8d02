// Kafka headers as the outbox keeps them: a flat JSON object whose values
// are strings.  Pure C++, noexcept.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace outbox::json {

struct Header {
    std::string name;
    std::string value;
};

// Decodes the text of a headers column: a JSON object whose values are
// strings.  Appends to `out` in the object's order.  Anything else (not an
// object, a value that is a number, null, array or object, invalid JSON)
// returns false with a sentence in `error` naming the offending header.
bool decode_headers(std::string_view json_text, std::vector<Header> &out,
                    std::string &error) noexcept;

// True when `headers` already holds a header called `name`.
bool has_header(const std::vector<Header> &headers, std::string_view name) noexcept;

}  // namespace outbox::json
