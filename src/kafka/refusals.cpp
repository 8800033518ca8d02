#include "outbox/pure_tu.h"
#include "outbox/kafka/refusals.h"

#include <algorithm>

namespace outbox::kafka {

std::string TopicRefusals::key_of(std::string_view topic, Scope scope) {
    std::string k(topic);
    k += '\0';
    k += static_cast<char>('0' + static_cast<int>(scope));
    return k;
}

void TopicRefusals::note(std::string_view topic, Scope scope, std::size_t bytes,
                         const std::string &reason, Clock::time_point now) noexcept {
    try {
        Entry &e = entries_[key_of(topic, scope)];
        bool fresh = e.period.count() == 0;
        if (!fresh && now < e.until) {
            // Refused again while remembered (records already on their way):
            // only the size bound may widen.
            if (scope == Scope::Size) e.min_bytes = std::min(e.min_bytes, bytes);
            return;
        }
        // A refusal soon after the memory expired: Kafka still refuses, wait
        // longer; after a quiet spell, start short again.
        bool again = !fresh && now - e.until < 2 * e.period;
        e.period = again ? std::min(kCap, 2 * e.period) : kFirst;
        e.scope = scope;
        e.min_bytes = (again && scope == Scope::Size) ? std::min(e.min_bytes, bytes) : bytes;
        e.reason = reason;
        e.since = now;
        e.until = now + e.period;
    } catch (...) {
        // Out of memory: nothing remembered, the record will be tried.
    }
}

bool TopicRefusals::refused(std::string_view topic, bool keyed, std::size_t bytes,
                            std::string &reason, Clock::time_point now) const noexcept {
    if (entries_.empty()) return false;
    try {
        for (Scope s : {Scope::Topic, Scope::Keyless, Scope::Size}) {
            auto it = entries_.find(key_of(topic, s));
            if (it == entries_.end() || now >= it->second.until) continue;
            const Entry &e = it->second;
            if (s == Scope::Keyless && keyed) continue;
            if (s == Scope::Size && bytes < e.min_bytes) continue;
            auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - e.since).count();
            reason = e.reason + " (not sent again: Kafka refused a record of this topic " +
                     std::to_string(ms) + " ms ago)";
            return true;
        }
        return false;
    } catch (...) {
        return false;
    }
}

}  // namespace outbox::kafka
