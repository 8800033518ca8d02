// Retry and batching policies of the workers, in one place.  Pure C++.
#pragma once

#include <cstddef>
#include <cstdint>

namespace outbox::policy {

// The relay backs off when a batch got nothing through (Kafka down or
// refusing): from this, doubling, up to the max; the next acknowledgement
// ends it.  Refused rows next to acknowledged ones wait the minimum.
inline constexpr int kRelayBackoffMinMs = 250;
inline constexpr int kRelayBackoffMaxMs = 30000;
// Exactly-once recovery (registering the transactional id, reading the
// progress topic) may block the relay this long at most, or
// outbox.batch_timeout when that is longer; then it tries again later.
inline constexpr int kEosRecoveryTimeoutMs = 30000;
// Exactly once: the next transaction starts at least this long after the
// last commit.  Kafka's coordinator refuses to register a transaction's
// partitions while it still writes the previous one's markers, and
// Debian 12's librdkafka then retries 20 ms later; on three brokers a
// 10 ms pause took a batch of 100 from 94 to 43 ms (bench/kafka_txn_cost.py
// --nodes 3 --pauses, docs/performance.md).
inline constexpr int kTxnSettleMs = 10;

// outbox.wait_for_standbys: a batch looks at the standbys' positions every
// millisecond for this long (a healthy standby's round trip: each step
// beyond it is latency), then every kStandbyPollMaxMs (no walsender wakes
// the relay).
inline constexpr int kStandbyFastPollMs = 50;
inline constexpr long kStandbyPollMaxMs = 20;

// Most headers one message may carry (outbox.write*() refuses more, and
// outbox.default_headers counts).
inline constexpr int kMaxHeaders = 1000;

// A message Kafka refused for good (too large, unknown topic or partition,
// not authorised) waits this long for its next attempt, doubling with each
// refusal, up to the cap; outbox.max_attempts refusals park it.  It holds
// back only the later messages of its key.
inline constexpr double kRefusedRetryBaseSeconds = 1;
inline constexpr double kRefusedRetryCapSeconds = 60;

// The relay stops claiming while this many batches' worth of records are in
// flight (an outage): it only records late reports then.
inline constexpr std::size_t kMaxBatchesInFlight = 4;

// A relay woken less than kBusyWindowMs after its last batch is under load:
// it lets commits gather before it claims again, 1 ms for every this many
// messages per second arriving, up to outbox.linger.
inline constexpr long kBusyWindowMs = 5;
inline constexpr double kLingerPerMsMessagesPerSecond = 500;

// Acknowledgements are marked in chunks of this many while the rest of a
// batch is still awaited.
inline constexpr std::size_t kMarkChunk = 200;

// Most bytes of values (payloads) one claim renders; the first row always
// goes, however large.
// A batch asks the cluster whether topics it has not seen yet exist for at
// most half of outbox.batch_timeout, and never more than this: the rest is
// the wait for acknowledgements, and the transaction never outlives the
// timeout because a broker went away before librdkafka noticed.
inline constexpr int kMetadataWaitMaxMs = 5000;
inline int metadata_wait_ms(int batch_timeout_ms) {
    return batch_timeout_ms / 2 < kMetadataWaitMaxMs ? batch_timeout_ms / 2 : kMetadataWaitMaxMs;
}

inline constexpr int64_t kBatchByteBudget = 32 * 1024 * 1024;

// A failed inbox handler call is retried after this many seconds, doubling
// with each failure, up to the cap; outbox.max_attempts failures park it.
inline constexpr double kHandlerRetryBaseSeconds = 0.5;
inline constexpr double kHandlerRetryCapSeconds = 300;

// An inbox handler takes at most this many of one topic's records in one
// transaction, and gives a topic this long before the next topic's turn.
inline constexpr int kMaxHandlerBatch = 1000;
inline constexpr long kTopicSliceMs = 200;

// ... and no more than this many bytes of records (the first always comes),
// read from its claim this many rows at a time at most.
inline constexpr int64_t kHandlerBatchBytes = 32 * 1024 * 1024;
inline constexpr long kHandlerFetchRows = 32;

// A handler call past outbox.inbox_handler_timeout is cancelled; one that
// is still running this long after (it caught its cancellation) is ended
// with its worker's process, and the call counts as a failed attempt.
inline constexpr long kHandlerCancelGraceMs = 1000;

// Retention deletes in transactions of this many rows; a pass stops after
// kPassBudgetMs and resumes at once.  The scan for stragglers (rows the
// commit callback never announced) gets at most 1/kStragglerCostShare of
// the maintenance worker's time.
inline constexpr int kRetentionBatch = 1000;
inline constexpr long kPassBudgetMs = 5000;
inline constexpr long kStragglerCostShare = 50;

}  // namespace outbox::policy
