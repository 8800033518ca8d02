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

}  // namespace outbox::sql
