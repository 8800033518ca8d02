// Exactly-once delivery (outbox.delivery = exactly_once), its pure part: the
// relay's Kafka transactional ids and the progress record each transaction
// carries.  What the records are for and how a relay recovers with them:
// docs/exactly-once.md.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace outbox::progress {

// What identifies a relay share's transactions: the cluster's system
// identifier (a base backup or a promoted standby keeps it, so their relays
// fence each other), the database and the share.  The prefix is the part
// every share of one database has.
std::string transactional_prefix(uint64_t system_identifier, std::string_view database);
std::string transactional_id(std::string_view prefix, int share, int shares);

// The share and share count a transactional id of `prefix` names; false
// when it is not one of `prefix`'s.
bool parse_transactional_id(std::string_view id, std::string_view prefix, int &share,
                            int &shares);

// One committed Kafka transaction of a relay: its sequence number (1, 2,
// ... per transactional id) and the outbox rows it carried.
struct Record {
    int64_t seq = 0;
    std::vector<int64_t> ids;  // ascending
    // What the rows were: the sum of row_digest() of each (records of
    // format 1 have none).  Recovery compares it with its own rows of those
    // ids, so that a copy of the database whose rows of those ids are other
    // messages (a split brain) does not mark them.
    bool has_digest = false;
    uint64_t digest = 0;
};

// One row's part of a Record's digest: a 64-bit hash of its id and its
// message_id as text.  Summed (mod 2^64), so the order does not matter.
uint64_t row_digest(int64_t id, std::string_view message_id) noexcept;

// The record's value: "pg_outbox progress 2 seq=<n> digest=<16 hex>
// ids=<a>-<b>,<c>,..." (runs of consecutive ids as ranges, so a batch of
// 1,000 rows that follow each other is a few bytes).  `ids` need not be
// sorted.
std::string encode(int64_t seq, std::vector<int64_t> ids, uint64_t digest);

// false, and why, when `value` is not such a record (format 1, without
// the digest, is read too).
bool decode(std::string_view value, Record &out, std::string &error);

}  // namespace outbox::progress
