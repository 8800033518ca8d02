// Comma-separated lists, as outbox.database and outbox.inbox_topics take
// them.  Pure C++: the GUC check hooks, the workers and the unit tests share
// this one parser.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace outbox {

// Splits `text` at commas and trims spaces and tabs around each item.  A
// text of only blanks is the empty list.  Otherwise every item must have
// something in it: "a,,b", ",a" and "a," are refused with a sentence in
// `error` that says which item is empty.
bool split_list(std::string_view text, std::vector<std::string> &items,
                std::string &error) noexcept;

// A list of names (databases): split_list, then 1..max_items items, each at
// most max_length bytes, none listed twice.
bool parse_name_list(std::string_view text, std::size_t max_items, std::size_t max_length,
                     std::vector<std::string> &names, std::string &error) noexcept;

// A list of Kafka topics: split_list, then every item a name Kafka accepts.
// The empty list is allowed (no topics).
bool parse_topic_list(std::string_view text, std::vector<std::string> &topics,
                      std::string &error) noexcept;

}  // namespace outbox
