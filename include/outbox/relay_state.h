// The relay's state between turns, and the steps its two delivery modes
// share.  Internal to the relay's two files:
//   src/relay_worker.cpp  the worker, its turn, the claim and the marks, and
//                         at-least-once delivery (docs/architecture.md);
//   src/relay_eos.cpp     exactly-once delivery: a Kafka transaction per
//                         claim, recovery before the first claim
//                         (docs/exactly-once.md).
// Boundary: as in both files, no C++ object with a destructor lives on a
// Postgres stack frame; everything C++ is in RelayState.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "outbox/common/progress.h"
#include "outbox/common/said_once.h"
#include "outbox/kafka/producer.h"
#include "outbox/kafka/refusals.h"
#include "outbox/kafka_link.h"
#include "outbox/low_water.h"
#include "outbox/queries/relay.h"
#include "outbox/share.h"
#include "outbox/worker_common.h"

extern "C" {
#include "access/xlogdefs.h"
#include "utils/timestamp.h"
}

namespace outbox::relay {

using outbox::kafka::Producer;

// The progress topic's last record of each of this database's ids.
struct Progress {
    std::map<std::string, std::map<int32_t, std::string>> last;  // id -> partition -> value
};

// Everything the worker keeps between turns.  Allocated once with nothrow
// new; never freed (the process exits), never on a Postgres stack frame.
struct RelayState {
    std::unique_ptr<Producer> producer;
    OutboxKafkaLink link;  // what the producer was built from; the secrets file
    TimestampTz reconfigure_deadline = 0;  // settings changed while records were in flight
    TimestampTz next_claim_at = 0;         // backoff after failures
    int backoff_ms = 0;
    outbox::low_water::Mark mark;  // every row below it is published, parked or waiting
    // Messages Kafka refused for good wait for their next attempt (schema
    // 1.3): whether any may wait, and when the next is due.
    bool waiting_known = false;
    bool waiting = true;
    TimestampTz next_due = 0;
    TimestampTz last_batch_end = 0;  // when the last batch that claimed something committed
    bool last_batch_full = false;
    double rate = 0;                 // messages per second under load, smoothed
    bool said_no_brokers = false;
    // Counts of this turn, for the shared stats slot.
    uint64 turn_acked = 0;
    uint64 turn_failed = 0;
    uint64 turn_parked = 0;
    uint64 turn_transient = 0;  // failures Kafka may not repeat (an outage), not refusals
    outbox::SaidOnce reported_error;
    // outbox.wait_for_standbys: the WAL position a claimed batch needed and
    // no standby reached within outbox.batch_timeout (0: none).  No claim
    // until they hold it.
    XLogRecPtr standby_need = 0;
    // outbox.delivery = exactly_once (docs/exactly-once.md): the producer is
    // transactional, with this share's id; no claim before recovery has
    // settled its last transaction (eos_ready).  `seq` is the last
    // transaction this database recorded.  Fenced (another producer took
    // the id) or diverged (Kafka holds transactions this database never
    // recorded): nothing is claimed until the settings change or the worker
    // restarts; `stopped_settings` are the settings it stopped under.
    bool eos = false;
    bool eos_ready = false;
    std::string tid_prefix;
    std::string tid;
    int64 seq = 0;
    char *stopped_settings = nullptr;
    outbox::SaidOnce said_eos;
    Progress progress;          // recovery's reading of the progress topic
    outbox::progress::Record txn;  // one transaction's record (recovery)
    bool eos_unknown = false;   // the last commit's outcome is open: replace the producer
    bool eos_fenced = false;    // fenced during this turn: stop after it
    TimestampTz last_commit_at = 0;  // of the last Kafka transaction
    char eos_error[1024] = {0};
    // What Kafka refused lately, per topic: such records are charged, not
    // put into a transaction, until their retry time (docs/exactly-once.md,
    // "What a refusal costs").  Outlives a replaced producer.
    outbox::kafka::TopicRefusals refusals;
    // Topics of a transaction whose failure no record could be charged
    // with: tried one per transaction, first one first, so that the one
    // Kafka refuses fails alone and is charged.  Rows of the others wait
    // (pending) meanwhile.
    std::vector<std::string> suspects;
    // The producer was replaced after a transaction known not to be
    // committed (eos_after_turn): its successor only registers the id; the
    // progress topic has nothing to settle.
    bool eos_light = false;
};

inline RelayState *state(OutboxWorker *w) { return static_cast<RelayState *>(w->state); }

// ---- shared by both delivery modes (relay_worker.cpp) ----

// Flushes for up to flush_ms, then drops the producer; what it still held
// is abandoned (stays pending in the table).
void kafka_disconnect(RelayState *r, int flush_ms) noexcept;
// The next claim waits: 250 ms after a first failure, doubling to 30 s.
void backoff_after_failure(RelayState *r);
// Marks the rows the producer acknowledged, each with its partition and
// offset (this claim's by ctid, the others by id).  Returns how many.
std::size_t mark_acked(OutboxWorker *w, const OutboxClaim *claim);
// Sleeps `ms` without waking for each commit meanwhile.
void gather(long ms);

// ---- exactly once (relay_eos.cpp) ----

// This share's transactional id, from the system identifier and database.
void set_tids(RelayState *r, uint64 system_identifier, const char *dbname, OutboxShare share) noexcept;
// Before the first claim of a transactional producer: fences, registers,
// settles what Kafka committed and this database did not record.  True
// when the relay may claim.
bool eos_recover(OutboxWorker *w);
// Publishes a claim as one Kafka transaction and marks its rows, kept only
// if Kafka commits.  Returns how many rows were acknowledged.
std::size_t publish_transaction(OutboxWorker *w, const OutboxClaim *claim);
// After the turn's commit: stop when fenced, replace the producer when the
// last commit's outcome is open.
void eos_after_turn(OutboxWorker *w);

}  // namespace outbox::relay
