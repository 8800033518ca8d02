// SQL text the relay runs, kept apart from the Postgres-side code so that
// the unit tests can check the isolation spec runs exactly this text.
#pragma once

namespace outbox::sql {

// The relay's claim, in id order, skipping rows another transaction holds.
// specs/relay_claim.spec runs this exact text, as it does kClaimShare and
// kMarkPublished (test/unit/spec_sync_test.cpp checks it).
inline constexpr const char kClaim[] =
    "SELECT id, message_id, topic, key, payload::text, headers::text"
    " FROM outbox.outbox_message"
    " WHERE published_at IS NULL"
    " ORDER BY id LIMIT $1"
    " FOR UPDATE SKIP LOCKED";

// The same for one of several workers: each owns the keys whose hash falls
// in its share, so a key is always published by the same worker, in order.
inline constexpr const char kClaimShare[] =
    "SELECT id, message_id, topic, key, payload::text, headers::text"
    " FROM outbox.outbox_message"
    " WHERE published_at IS NULL"
    " AND (pg_catalog.hashtext(key) & 2147483647) % $2 = $3"
    " ORDER BY id LIMIT $1"
    " FOR UPDATE SKIP LOCKED";

// Marks the rows Kafka acknowledged.  published_at is the time of the
// acknowledgement (the statement's start), not of the claim.
inline constexpr const char kMarkPublished[] =
    "UPDATE outbox.outbox_message SET published_at = pg_catalog.statement_timestamp()"
    " WHERE id = ANY($1) AND published_at IS NULL";

// Counts a failed attempt and keeps librdkafka's error text, per row.
inline constexpr const char kRecordFailures[] =
    "UPDATE outbox.outbox_message m SET attempts = m.attempts + 1, last_error = f.error"
    " FROM pg_catalog.unnest($1, $2) AS f(id, error)"
    " WHERE m.id = f.id AND m.published_at IS NULL";

// outbox.write()'s insert.
inline constexpr const char kInsertMessage[] =
    "INSERT INTO outbox.outbox_message (message_id, topic, key, payload, headers)"
    " VALUES ($1, $2, $3, $4, $5)";

}  // namespace outbox::sql
