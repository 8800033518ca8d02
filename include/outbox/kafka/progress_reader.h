// Exactly-once recovery, the Kafka side: what the progress topic holds for
// a relay's transactional ids.  Pure C++: no Postgres headers, nothing
// thrown out of the API.
#pragma once

#include <map>
#include <string>

#include "outbox/kafka/client.h"

namespace outbox::kafka {

// Reads `topic` from its beginning to its end as a read_committed consumer
// (a record of an aborted or still open transaction is never seen), and
// keeps the last value of each key that starts with `prefix`, per partition
// (a key's records are all in one partition unless partitions were added).  No consumer
// group, nothing committed.  False with the reason (the topic is missing,
// not readable, or the end was not reached within timeout_ms).
bool read_progress(const ClientSettings &client, const std::string &topic,
                   const std::string &prefix, int timeout_ms,
                   std::map<std::string, std::map<int32_t, std::string>> &last,
                   std::string &error) noexcept;

}  // namespace outbox::kafka
