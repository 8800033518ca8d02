#include "outbox/pure_tu.h"
#include "outbox/common/list.h"

#include "outbox/common/topic.h"

namespace outbox {

namespace {

bool is_blank(char c) { return c == ' ' || c == '\t'; }

std::string_view trim(std::string_view s) {
    while (!s.empty() && is_blank(s.front())) s.remove_prefix(1);
    while (!s.empty() && is_blank(s.back())) s.remove_suffix(1);
    return s;
}

}  // namespace

bool split_list(std::string_view text, std::vector<std::string> &items,
                std::string &error) noexcept {
    try {
        items.clear();
        if (trim(text).empty()) return true;
        std::size_t n = 1;
        for (;;) {
            std::size_t comma = text.find(',');
            std::string_view item = trim(text.substr(0, comma));
            if (item.empty()) {
                error = "item " + std::to_string(n) + " of the list is empty";
                return false;
            }
            items.emplace_back(item);
            if (comma == std::string_view::npos) return true;
            text.remove_prefix(comma + 1);
            ++n;
        }
    } catch (const std::exception &e) {
        error = e.what();
        return false;
    }
}

bool parse_name_list(std::string_view text, std::size_t max_items, std::size_t max_length,
                     std::vector<std::string> &names, std::string &error) noexcept {
    try {
        if (!split_list(text, names, error)) return false;
        if (names.empty()) {
            error = "the list is empty";
            return false;
        }
        if (names.size() > max_items) {
            error = "at most " + std::to_string(max_items) + " names can be listed";
            return false;
        }
        for (std::size_t i = 0; i < names.size(); ++i) {
            if (names[i].size() > max_length) {
                error = "\"" + names[i] + "\" is longer than " + std::to_string(max_length) +
                        " bytes";
                return false;
            }
            for (std::size_t j = 0; j < i; ++j)
                if (names[j] == names[i]) {
                    error = "\"" + names[i] + "\" is listed twice";
                    return false;
                }
        }
        return true;
    } catch (const std::exception &e) {
        error = e.what();
        return false;
    }
}

bool parse_topic_list(std::string_view text, std::vector<std::string> &topics,
                      std::string &error) noexcept {
    try {
        if (!split_list(text, topics, error)) return false;
        for (const std::string &t : topics)
            if (const char *why = topic_name_error(t)) {
                error = "\"" + t + "\": " + why;
                return false;
            }
        return true;
    } catch (const std::exception &e) {
        error = e.what();
        return false;
    }
}

}  // namespace outbox
