// Kafka topic name rules, shared by outbox.write() and the relay.
#pragma once

#include <string_view>

namespace outbox {

inline constexpr std::size_t kMaxTopicLength = 249;

// nullptr when Kafka accepts `name` as a topic, else a static sentence that
// says what is wrong with it (for an error detail).
const char *topic_name_error(std::string_view name) noexcept;

}  // namespace outbox
