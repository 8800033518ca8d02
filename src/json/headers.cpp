#include "outbox/pure_tu.h"
#include "outbox/json/headers.h"

#include <nlohmann/json.hpp>

namespace outbox::json {

namespace {

template <typename Json>
const char *type_word(const Json &v) {
    switch (v.type()) {
        case nlohmann::detail::value_t::null: return "null";
        case nlohmann::detail::value_t::boolean: return "a boolean";
        case nlohmann::detail::value_t::number_integer:
        case nlohmann::detail::value_t::number_unsigned:
        case nlohmann::detail::value_t::number_float: return "a number";
        case nlohmann::detail::value_t::array: return "an array";
        case nlohmann::detail::value_t::object: return "an object";
        case nlohmann::detail::value_t::string: return "a string";
        default: return "not a string";
    }
}

}  // namespace

bool decode_headers(std::string_view json_text, std::vector<Header> &out,
                    std::string &error) noexcept {
    try {
        nlohmann::ordered_json doc = nlohmann::ordered_json::parse(json_text, nullptr, false);
        if (doc.is_discarded()) {
            error = "headers are not valid JSON";
            return false;
        }
        if (!doc.is_object()) {
            error = std::string("headers must be a JSON object, got ") + type_word(doc);
            return false;
        }
        for (auto it = doc.begin(); it != doc.end(); ++it) {
            if (!it.value().is_string()) {
                error = "header \"" + it.key() + "\" is " + type_word(it.value()) +
                        ", but header values must be strings";
                return false;
            }
            out.push_back(Header{it.key(), it.value().get<std::string>()});
        }
        return true;
    } catch (const std::exception &e) {
        error = std::string("headers could not be decoded: ") + e.what();
        return false;
    }
}

bool encode_headers(const std::vector<Header> &headers, std::string &out) noexcept {
    try {
        nlohmann::ordered_json obj = nlohmann::ordered_json::object();
        for (const Header &h : headers) obj[h.name] = h.value;
        out = obj.dump();
        return true;
    } catch (...) {
        return false;
    }
}

bool has_header(const std::vector<Header> &headers, std::string_view name) noexcept {
    for (const Header &h : headers)
        if (h.name == name) return true;
    return false;
}

}  // namespace outbox::json
