// Exactly-once mode: what Kafka refused lately, per topic, so that records
// it would refuse again are not put into a transaction before their retry
// time.  One refused record aborts a whole Kafka transaction (everyone's
// records in it go again); without this memory a stream of refused records
// would cost a transaction per record, paid by every other role.
//
// Pure C++: no Postgres headers, nothing thrown out of the API.  Owned by
// the relay for the worker's life (it outlives a replaced producer).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <unordered_map>

namespace outbox::kafka {

class TopicRefusals {
public:
    using Clock = std::chrono::steady_clock;

    // Which records of a topic a refusal says Kafka will refuse again.
    enum class Scope {
        Topic,    // every record (not authorised, internal topic, policy, ...)
        Keyless,  // records without a key (a compacted topic)
        Size,     // records at least as large as the refused one
    };

    // Kafka refused a record of `topic` for good: records in `scope`
    // (`bytes`: the refused record's key and value bytes, for Size) are
    // held back for a while.  The while doubles (1 s up to 60 s, as the
    // rows' own retry times do) for each refusal that follows the last
    // one's expiry, and starts again at 1 s after a quiet spell.
    void note(std::string_view topic, Scope scope, std::size_t bytes, const std::string &reason,
              Clock::time_point now = Clock::now()) noexcept;

    // Whether a record of `topic` (`keyed`, `bytes`) is refused by memory
    // now: then `reason` says Kafka's reason and since when.
    bool refused(std::string_view topic, bool keyed, std::size_t bytes, std::string &reason,
                 Clock::time_point now = Clock::now()) const noexcept;

    // Any memory still in force (cheap check on the hot path).
    bool empty() const noexcept { return entries_.empty(); }
    void clear() noexcept { entries_.clear(); }

    static constexpr std::chrono::milliseconds kFirst{1000};
    static constexpr std::chrono::milliseconds kCap{60000};

private:
    struct Entry {
        Scope scope = Scope::Topic;
        std::size_t min_bytes = 0;  // Size: the smallest refused record
        std::string reason;
        Clock::time_point since;
        Clock::time_point until;
        std::chrono::milliseconds period{0};
    };
    // Topic and scope: a topic may have a Size and a Keyless memory at once.
    std::unordered_map<std::string, Entry> entries_;
    static std::string key_of(std::string_view topic, Scope scope);
};

}  // namespace outbox::kafka
