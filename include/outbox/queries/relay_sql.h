// The relay's SQL, with the positions of the columns it reads.  Pure C++
// (texts only) so that the unit tests can check that the isolation spec
// runs exactly these statements; src/queries/relay.cpp runs them.
#pragma once

namespace outbox::sql::relay {

// A pending row the claim may take when messages wait for a retry: it is
// not waiting itself (or its retry is due), and no earlier message of its
// topic and key waits (a refused message holds its key's later ones on its
// topic back, in order, until it goes through or is parked; the same key on
// another topic is another order, and a keyless row, key NULL, is held by
// nothing).  One probe of the small ix_outbox_message_waiting per row, and
// only while something waits.
#define OUTBOX_CLAIMABLE                                                                 \
    "(m.next_attempt_at IS NULL OR m.next_attempt_at <= pg_catalog.now())"               \
    " AND NOT EXISTS (SELECT FROM outbox.outbox_message w WHERE w.key = m.key"           \
    " AND w.topic = m.topic"                                                             \
    " AND w.id < m.id AND w.published_at IS NULL AND w.next_attempt_at > pg_catalog.now())"

// A key's order is per topic: the relay lists the (topic, key) pairs with
// records in flight as "topic key" (a topic name has no space: Kafka's
// names are [a-zA-Z0-9._-], and outbox.write() refuses others), and the
// claim skips a row whose pair is listed.  Keyless rows are never skipped.
#define OUTBOX_NOT_IN_FLIGHT                                                             \
    " AND (key IS NULL OR (topic || ' ' || key) NOT IN (SELECT pg_catalog.unnest($2)))"

// Each key goes through one worker of the share ($4 of $3) whatever its
// topic; keyless rows are spread by id.
#define OUTBOX_IN_SHARE                                                                  \
    " AND (COALESCE(pg_catalog.hashtext(key) & 2147483647, id)) % $3 = $4"

// The claim: pending rows in id order from the worker's low-water mark $5
// (below it everything is published, parked or waiting: the dead index
// entries left there are never walked again), skipping rows another
// transaction holds, parked rows, (topic, key) pairs that still have
// records in flight ($2: a key's next record waits for the one before it;
// NOT IN a subquery hashes them once, where <> ALL would compare each row
// with every key), keys outside this worker's share ($4 of $3: each key
// always goes through the same worker, so its records stay in order), and,
// unless $6 says nothing waits, rows
// that wait for a retry or behind one (OUTBOX_CLAIMABLE).  The payload
// comes as jsonb: the relay renders it within a byte budget.
// specs/relay_claim.spec runs this exact text.
inline constexpr const char kClaim[] =
    "SELECT id, message_id, topic, key, payload, headers, ctid AS claimed_ctid,"
    " is_binary, key_bytes, value, kafka_partition"
    " FROM outbox.outbox_message m"
    " WHERE published_at IS NULL AND parked_at IS NULL AND id >= $5"
    OUTBOX_NOT_IN_FLIGHT
    OUTBOX_IN_SHARE
    " AND ($6 OR " OUTBOX_CLAIMABLE ")"
    " ORDER BY id LIMIT $1"
    " FOR UPDATE SKIP LOCKED";

// The same claim on schema 1.2 (before ALTER EXTENSION outbox UPDATE): no
// message waits for a retry there.
inline constexpr const char kClaimBefore13[] =
    "SELECT id, message_id, topic, key, payload, headers, ctid AS claimed_ctid,"
    " is_binary, key_bytes, value, kafka_partition"
    " FROM outbox.outbox_message"
    " WHERE published_at IS NULL AND parked_at IS NULL AND id >= $5"
    " AND (topic || ' ' || key) NOT IN (SELECT pg_catalog.unnest($2))"
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
    " AND (topic || ' ' || key) NOT IN (SELECT pg_catalog.unnest($2))"
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

// The first pending (unparked) row at or above $1, of any share, that a
// claim may take ($2: nothing waits for a retry): where the next claim may
// start.  A short walk, from the mark to that row; rows of the other
// workers' shares only ever keep the mark lower than it could be.  Rows
// that wait are passed: the relay lowers its mark again when one is due.
inline constexpr const char kFirstPending[] =
    "SELECT id FROM outbox.outbox_message m"
    " WHERE published_at IS NULL AND parked_at IS NULL AND id >= $1"
    " AND ($2 OR " OUTBOX_CLAIMABLE ")"
    " ORDER BY id LIMIT 1";

inline constexpr const char kFirstPendingBefore13[] =
    "SELECT id FROM outbox.outbox_message"
    " WHERE published_at IS NULL AND parked_at IS NULL AND id >= $1"
    " ORDER BY id LIMIT 1";

// When the next message that waits for a retry is due (NULL: none waits),
// and the lowest id among those due now: the relay's mark goes back there.
inline constexpr const char kNextRetry[] =
    "SELECT min(next_attempt_at) FROM outbox.outbox_message"
    " WHERE published_at IS NULL AND next_attempt_at IS NOT NULL";
// (OFFSET 0 keeps the planner from reading min(id) off the index of all
// pending rows in id order, a walk of the whole backlog: the due rows come
// from ix_outbox_message_retry_at.)
inline constexpr const char kFirstDue[] =
    "SELECT min(d.id) FROM (SELECT id FROM outbox.outbox_message"
    " WHERE published_at IS NULL AND next_attempt_at IS NOT NULL"
    " AND next_attempt_at <= pg_catalog.now() OFFSET 0) d";

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

// The same from schema 1.6: each row keeps where Kafka wrote its record,
// the partition ($2) and offset ($3) of its acknowledgement, side by side
// with the ctids ($1) or ids.  One statement per batch still: a nested
// loop of TID scans, or the pending index probed for the ids alone (the
// join never reads more of it), as sql/plans.sql shows.
inline constexpr const char kMarkClaimedPublishedAt[] =
    "UPDATE outbox.outbox_message m SET published_at = pg_catalog.statement_timestamp(),"
    " published_partition = a.p, published_offset = a.o"
    " FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.tid[]),"
    " pg_catalog.unnest($2::pg_catalog.int4[]), pg_catalog.unnest($3::pg_catalog.int8[]))"
    " AS a(t, p, o) WHERE m.ctid = a.t";
inline constexpr const char kMarkPublishedAt[] =
    "UPDATE outbox.outbox_message m SET published_at = pg_catalog.statement_timestamp(),"
    " published_partition = a.p, published_offset = a.o"
    " FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.int8[]),"
    " pg_catalog.unnest($2::pg_catalog.int4[]), pg_catalog.unnest($3::pg_catalog.int8[]))"
    " AS a(i, p, o) WHERE m.id = ANY($1) AND m.id = a.i AND m.published_at IS NULL";

// Counts a failed attempt on rows $1 that failed alike: librdkafka's error
// text $2, Kafka refused them for good ($3), or the relay cannot send them
// at all ($5: they could not even be rendered).  A row refused for good for
// the $4th time is parked, and so is one the relay cannot send; one refused
// for good before that waits for its next attempt: $6 seconds, doubling
// with each refusal, up to $7.  Returns the rows, so that the relay can log
// what it parked and learn when the next is due (how long each waits).
// The relay runs it once per kind of failure of a batch: each row is looked
// up by id, never joined with the other failures (a batch Kafka refused
// whole is thousands of rows).
inline constexpr const char kRecordFailures[] =
    "UPDATE outbox.outbox_message m SET attempts = m.attempts + 1, last_error = $2,"
    " parked_at = CASE WHEN $5 OR ($3 AND m.attempts + 1 >= $4)"
    " THEN pg_catalog.statement_timestamp() ELSE m.parked_at END,"
    " next_attempt_at = CASE WHEN $3 AND NOT $5 AND m.attempts + 1 < $4"
    " THEN pg_catalog.statement_timestamp() + pg_catalog.make_interval(secs => LEAST($7::float8,"
    " $6::float8 * pg_catalog.power(2::float8, m.attempts::float8))) END"
    " WHERE m.id = ANY($1) AND m.published_at IS NULL"
    " RETURNING m.message_id::text, m.topic, m.attempts, m.parked_at IS NOT NULL AS parked_now,"
    " m.last_error, m.id, m.next_attempt_at - pg_catalog.statement_timestamp() AS waits";

// The same on schema 1.2: a refused row is claimed again at once.
inline constexpr const char kRecordFailuresBefore13[] =
    "UPDATE outbox.outbox_message m SET attempts = m.attempts + 1, last_error = $2,"
    " parked_at = CASE WHEN $5 OR ($3 AND m.attempts + 1 >= $4)"
    " THEN pg_catalog.statement_timestamp() ELSE m.parked_at END"
    " WHERE m.id = ANY($1) AND m.published_at IS NULL"
    " RETURNING m.message_id::text, m.topic, m.attempts, m.parked_at IS NOT NULL AS parked_now,"
    " m.last_error, m.id, NULL::interval";

enum FailureColumn {
    kFailureMessageId = 1,
    kFailureTopic,
    kFailureAttempts,
    kFailureParkedNow,
    kFailureError,
    kFailureId,
    kFailureWaits,
};

}  // namespace outbox::sql::relay
