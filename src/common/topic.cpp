#include "outbox/pure_tu.h"
#include "outbox/common/topic.h"

namespace outbox {

// The rules of Kafka's own Topic.validate(): 1..249 characters from
// [a-zA-Z0-9._-], and not "." or "..".
const char *topic_name_error(std::string_view name) noexcept {
    if (name.empty()) return "A topic name must not be empty";
    if (name.size() > kMaxTopicLength) return "A topic name must be at most 249 characters long";
    if (name == "." || name == "..") return "\".\" and \"..\" are not valid topic names";
    for (char c : name) {
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
        if (!ok) return "A topic name may contain only ASCII letters, digits, '.', '_' and '-'";
    }
    return nullptr;
}

}  // namespace outbox
