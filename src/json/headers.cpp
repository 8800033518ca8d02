#include "outbox/pure_tu.h"
#include "outbox/json/headers.h"

#include <unordered_map>

#include <nlohmann/json.hpp>

namespace outbox::json {

namespace {

// Reads a flat object of strings in one pass, in linear time whatever the
// number of headers (a JSON object that searches its keys on every insert
// costs seconds for tens of thousands of them).  A name given twice keeps
// its first place and its last value, as JSON objects do.
class HeaderReader : public nlohmann::json_sax<nlohmann::json> {
public:
    HeaderReader(std::vector<Header> &out, std::string &error) : out_(out), error_(error) {}

    bool null() override { return scalar("null"); }
    bool boolean(bool) override { return scalar("a boolean"); }
    bool number_integer(number_integer_t) override { return scalar("a number"); }
    bool number_unsigned(number_unsigned_t) override { return scalar("a number"); }
    bool number_float(number_float_t, const string_t &) override { return scalar("a number"); }
    bool binary(binary_t &) override { return scalar("not a string"); }
    bool string(string_t &val) override {
        if (depth_ == 0) return refuse(std::string("headers must be a JSON object, got a string"));
        auto [at, fresh] = index_.emplace(key_, out_.size());
        if (fresh)
            out_.push_back(Header{key_, std::move(val)});
        else
            out_[at->second].value = std::move(val);
        return true;
    }
    bool start_object(std::size_t) override { return nested("an object"); }
    bool end_object() override { return true; }
    bool start_array(std::size_t) override {
        if (depth_ == 0) return refuse("headers must be a JSON object, got an array");
        return nested("an array");
    }
    bool end_array() override { return true; }
    bool key(string_t &val) override {
        key_ = std::move(val);
        return true;
    }
    bool parse_error(std::size_t, const std::string &, const nlohmann::detail::exception &) override {
        if (error_.empty()) error_ = "headers are not valid JSON";
        return false;
    }

private:
    bool refuse(std::string why) {
        error_ = std::move(why);
        return false;
    }
    bool scalar(const char *what) {
        if (depth_ == 0) return refuse(std::string("headers must be a JSON object, got ") + what);
        return refuse("header \"" + key_ + "\" is " + what + ", but header values must be strings");
    }
    bool nested(const char *what) {
        if (depth_ == 0) {
            depth_ = 1;
            return true;
        }
        return scalar(what);
    }

    std::vector<Header> &out_;
    std::string &error_;
    std::unordered_map<std::string, std::size_t> index_;
    std::string key_;
    int depth_ = 0;
};

}  // namespace

bool decode_headers(std::string_view json_text, std::vector<Header> &out,
                    std::string &error) noexcept {
    try {
        std::size_t first = out.size();
        error.clear();
        HeaderReader reader(out, error);
        if (nlohmann::json::sax_parse(json_text, &reader)) return true;
        out.resize(first);
        if (error.empty()) error = "headers are not valid JSON";
        return false;
    } catch (const std::exception &e) {
        error = std::string("headers could not be decoded: ") + e.what();
        return false;
    }
}

bool has_header(const std::vector<Header> &headers, std::string_view name) noexcept {
    for (const Header &h : headers)
        if (h.name == name) return true;
    return false;
}

}  // namespace outbox::json
