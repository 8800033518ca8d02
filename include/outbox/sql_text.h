// SQL text the relay runs, kept apart from the Postgres-side code so that
// the unit tests can check the isolation spec runs exactly this text.
#pragma once

namespace outbox::sql {

// The relay's claim: pending rows in id order, skipping rows another
// transaction holds, parked rows, keys that still have records in flight
// ($2: a key's next record waits for the one before it), and keys outside
// this worker's share ($4 of $3: each key always goes through the same
// worker, so its records stay in order).  specs/relay_claim.spec runs this
// exact text, as it does kMarkPublished (test/unit/spec_sync_test.cpp).
inline constexpr const char kClaim[] =
    "SELECT id, message_id, topic, key, payload::text, headers::text, ctid AS claimed_ctid"
    " FROM outbox.outbox_message"
    " WHERE published_at IS NULL AND parked_at IS NULL"
    " AND key <> ALL($2)"
    " AND (pg_catalog.hashtext(key) & 2147483647) % $3 = $4"
    " ORDER BY id LIMIT $1"
    " FOR UPDATE SKIP LOCKED";

// Marks the rows of this transaction's claim that Kafka acknowledged, by
// their ctid (a TID scan: no index lookup).  Only for rows this transaction
// locked with the claim: nobody can have moved them since.  published_at is
// the time of the acknowledgement (the statement's start), not of the claim.
inline constexpr const char kMarkClaimedPublished[] =
    "UPDATE outbox.outbox_message SET published_at = pg_catalog.statement_timestamp()"
    " WHERE ctid = ANY($1) AND published_at IS NULL";

// Marks acknowledged rows of earlier batches (late), by id.
inline constexpr const char kMarkPublished[] =
    "UPDATE outbox.outbox_message SET published_at = pg_catalog.statement_timestamp()"
    " WHERE id = ANY($1) AND published_at IS NULL";

// Counts a failed attempt and keeps librdkafka's error text, per row; a
// row Kafka refused for good ($3) for the $4th time is parked.  Returns the
// rows, so that the relay can log what it parked.
inline constexpr const char kRecordFailures[] =
    "UPDATE outbox.outbox_message m SET attempts = m.attempts + 1, last_error = f.error,"
    " parked_at = CASE WHEN f.permanent AND m.attempts + 1 >= $4"
    " THEN pg_catalog.statement_timestamp() ELSE m.parked_at END"
    " FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3))"
    " AS f(id, error, permanent)"
    " WHERE m.id = f.id AND m.published_at IS NULL"
    " RETURNING m.message_id::text, m.topic, m.attempts, m.parked_at IS NOT NULL AS parked_now,"
    " m.last_error";

// outbox.write()'s insert.
inline constexpr const char kInsertMessage[] =
    "INSERT INTO outbox.outbox_message (message_id, topic, key, payload, headers)"
    " VALUES ($1, $2, $3, $4, $5)";

// Retention: old rows, a batch at a time, oldest first.  Each locks only
// the rows it deletes, skips rows someone else holds, and rechecks the
// condition on the locked row, so a row replayed meanwhile (published_at
// reset) is never deleted.  $1: the cutoff, $2: the batch size.
inline constexpr const char kRetentionPublished[] =
    "DELETE FROM outbox.outbox_message WHERE id IN ("
    "SELECT id FROM outbox.outbox_message WHERE published_at < $1"
    " ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)"
    " AND published_at < $1";

inline constexpr const char kRetentionProcessedEvents[] =
    "DELETE FROM outbox.processed_event WHERE event_id IN ("
    "SELECT event_id FROM outbox.processed_event WHERE expires_at < $1"
    " ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)"
    " AND expires_at < $1";

inline constexpr const char kRetentionInbox[] =
    "DELETE FROM outbox.inbox_message WHERE event_id IN ("
    "SELECT event_id FROM outbox.inbox_message WHERE processed AND processed_at < $1"
    " ORDER BY processed_at LIMIT $2 FOR UPDATE SKIP LOCKED)"
    " AND processed AND processed_at < $1";

// ---- inbox ----

// The consumer's batch: one row per record, a duplicate event_id dropped.
// A record without a UUID event_id header gets one derived from where it
// is in Kafka (topic/partition/offset), so a redelivery is still known.
inline constexpr const char kInboxInsert[] =
    "INSERT INTO outbox.inbox_message"
    " (event_id, topic, key, payload, headers, kafka_partition, kafka_offset)"
    " SELECT coalesce(r.event_id::uuid,"
    " pg_catalog.md5(r.topic || '/' || r.kafka_partition || '/' || r.kafka_offset)::uuid),"
    " r.topic, r.key, r.payload::jsonb, r.headers::jsonb, r.kafka_partition, r.kafka_offset"
    " FROM ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[]),"
    " pg_catalog.unnest($3::text[]), pg_catalog.unnest($4::text[]),"
    " pg_catalog.unnest($5::text[]), pg_catalog.unnest($6::int4[]),"
    " pg_catalog.unnest($7::int8[]))"
    " AS r(event_id, topic, key, payload, headers, kafka_partition, kafka_offset)"
    " ON CONFLICT (event_id) DO NOTHING";

// The same for one record whose value Postgres' jsonb refuses (say a
// \u0000 escape): kept as text, never dropped.
inline constexpr const char kInboxInsertRaw[] =
    "INSERT INTO outbox.inbox_message"
    " (event_id, topic, key, payload, headers, kafka_partition, kafka_offset)"
    " VALUES (coalesce($1::uuid, pg_catalog.md5($2 || '/' || $6 || '/' || $7)::uuid),"
    " $2, $3, pg_catalog.jsonb_build_object('raw_text', $4::text), $5::jsonb, $6, $7)"
    " ON CONFLICT (event_id) DO NOTHING";

// The handler's claim: unprocessed records of subscribed topics ($2), in
// arrival order, skipping parked ones, ones waiting for a retry, and keys
// with an earlier record waiting for a retry ($3).
inline constexpr const char kInboxClaim[] =
    "SELECT m, m.event_id, m.topic, m.key FROM outbox.inbox_message m"
    " WHERE NOT m.processed AND m.parked_at IS NULL"
    " AND (m.next_attempt_at IS NULL OR m.next_attempt_at <= pg_catalog.now())"
    " AND m.topic = ANY($2) AND (m.key IS NULL OR m.key <> ALL($3))"
    " ORDER BY m.received_at, m.seq LIMIT $1"
    " FOR UPDATE SKIP LOCKED";

inline constexpr const char kInboxRetryingKeys[] =
    "SELECT DISTINCT key FROM outbox.inbox_message"
    " WHERE NOT processed AND next_attempt_at IS NOT NULL"
    " AND next_attempt_at > pg_catalog.now() AND parked_at IS NULL AND key IS NOT NULL";

inline constexpr const char kInboxNextRetry[] =
    "SELECT min(next_attempt_at) FROM outbox.inbox_message"
    " WHERE NOT processed AND next_attempt_at IS NOT NULL AND parked_at IS NULL";

inline constexpr const char kInboxSubscriptions[] =
    "SELECT topic, handler::oid, run_as::oid FROM outbox.inbox_subscription";

inline constexpr const char kInboxDone[] =
    "UPDATE outbox.inbox_message SET processed = true,"
    " processed_at = pg_catalog.clock_timestamp(), next_attempt_at = NULL"
    " WHERE event_id = $1";

// A failed handler call: one attempt more, the error kept, a retry after
// 0.5 s doubling to 5 min, parked at the $3rd failure.
inline constexpr const char kInboxFailed[] =
    "UPDATE outbox.inbox_message SET attempts = attempts + 1, last_error = $2,"
    " next_attempt_at = CASE WHEN attempts + 1 >= $3 THEN NULL ELSE pg_catalog.clock_timestamp()"
    " + pg_catalog.make_interval(secs => least(300, 0.5 * pg_catalog.power(2, attempts))) END,"
    " parked_at = CASE WHEN attempts + 1 >= $3 THEN pg_catalog.clock_timestamp() END"
    " WHERE event_id = $1 RETURNING parked_at IS NOT NULL";

}  // namespace outbox::sql
