// The relay's SQL, with the positions of the columns it reads.  Pure C++
// (texts only) so that the unit tests can check that the isolation spec
// runs exactly these statements; src/queries/relay.cpp runs them.
#pragma once

namespace outbox::sql::relay {

// The claim: pending rows in id order from the worker's low-water mark $5
// (below it everything is published or parked: the dead index entries left
// there are never walked again), skipping rows another transaction holds,
// parked rows, keys that still have records in flight ($2: a key's next
// record waits for the one before it), and keys outside this worker's share
// ($4 of $3: each key always goes through the same worker, so its records
// stay in order).  The payload comes as jsonb: the relay renders it within
// a byte budget.  specs/relay_claim.spec runs this exact text.
inline constexpr const char kClaim[] =
    "SELECT id, message_id, topic, key, payload, headers, ctid AS claimed_ctid,"
    " is_binary, key_bytes, value, kafka_partition"
    " FROM outbox.outbox_message"
    " WHERE published_at IS NULL AND parked_at IS NULL AND id >= $5"
    " AND key <> ALL($2)"
    " AND (pg_catalog.hashtext(key) & 2147483647) % $3 = $4"
    " ORDER BY id LIMIT $1"
    " FOR UPDATE SKIP LOCKED";

// The same claim on a schema older than 1.2 (before ALTER EXTENSION outbox
// UPDATE): no binary messages, no explicit partitions.
inline constexpr const char kClaimBefore12[] =
    "SELECT id, message_id, topic, key, payload, headers, ctid AS claimed_ctid,"
    " false, NULL::bytea, NULL::bytea, NULL::integer"
    " FROM outbox.outbox_message"
    " WHERE published_at IS NULL AND parked_at IS NULL AND id >= $5"
    " AND key <> ALL($2)"
    " AND (pg_catalog.hashtext(key) & 2147483647) % $3 = $4"
    " ORDER BY id LIMIT $1"
    " FOR UPDATE SKIP LOCKED";

enum ClaimColumn {
    kClaimId = 1,
    kClaimMessageId,
    kClaimTopic,
    kClaimKey,
    kClaimPayload,
    kClaimHeaders,
    kClaimCtid,
    kClaimIsBinary,
    kClaimKeyBytes,
    kClaimValue,
    kClaimPartition,
};

// The first pending (unparked) row at or above $1, of any share: where the
// next claim may start.  A short walk, from the mark to that row; rows of
// the other workers' shares only ever keep the mark lower than it could be.
inline constexpr const char kFirstPending[] =
    "SELECT id FROM outbox.outbox_message"
    " WHERE published_at IS NULL AND parked_at IS NULL AND id >= $1"
    " ORDER BY id LIMIT 1";

// Marks the rows of this transaction's claim that Kafka acknowledged, by
// their ctid (a TID scan: no index lookup).  Only for rows this transaction
// locked with the claim: nobody can have moved or marked them since, so no
// other condition is needed, and none is there: "published_at IS NULL"
// would let the planner walk the partial index instead (all of it, dead
// entries a long snapshot keeps included).  published_at is the time of the
// acknowledgement (the statement's start), not of the claim.
inline constexpr const char kMarkClaimedPublished[] =
    "UPDATE outbox.outbox_message SET published_at = pg_catalog.statement_timestamp()"
    " WHERE ctid = ANY($1)";

// Marks acknowledged rows of earlier batches (late), by id.
inline constexpr const char kMarkPublished[] =
    "UPDATE outbox.outbox_message SET published_at = pg_catalog.statement_timestamp()"
    " WHERE id = ANY($1) AND published_at IS NULL";

// Counts a failed attempt and keeps librdkafka's error text, per row; a row
// Kafka refused for good ($3) for the $4th time is parked, and so is a row
// the relay cannot send at all ($5: it could not even be rendered).  Returns
// the rows, so that the relay can log what it parked.  (m.id = ANY($1)
// makes every plan look the rows up by id.)
inline constexpr const char kRecordFailures[] =
    "UPDATE outbox.outbox_message m SET attempts = m.attempts + 1, last_error = f.error,"
    " parked_at = CASE WHEN f.park_now OR (f.permanent AND m.attempts + 1 >= $4)"
    " THEN pg_catalog.statement_timestamp() ELSE m.parked_at END"
    " FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3),"
    " pg_catalog.unnest($5))"
    " AS f(id, error, permanent, park_now)"
    " WHERE m.id = ANY($1) AND m.id = f.id AND m.published_at IS NULL"
    " RETURNING m.message_id::text, m.topic, m.attempts, m.parked_at IS NOT NULL AS parked_now,"
    " m.last_error";

enum FailureColumn {
    kFailureMessageId = 1,
    kFailureTopic,
    kFailureAttempts,
    kFailureParkedNow,
    kFailureError,
};

}  // namespace outbox::sql::relay
