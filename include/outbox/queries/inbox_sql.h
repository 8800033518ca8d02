// The inbox's SQL: the consumer's inserts, the handlers' claims and
// bookkeeping (src/queries/inbox.cpp runs it).  Pure C++: texts only.
#pragma once

namespace outbox::sql::inbox {

// The consumer's batch: one row per record, a known event_id dropped.  A
// record without a UUID event_id header gets an id derived from where it is
// in Kafka and when it was written there (topic/partition/offset/timestamp):
// a redelivery of the record has the same, and a topic deleted and created
// again (offsets from 0) does not reuse the ids of the old records.
// Arrays: $1 event ids (NULL: derive), $2 topics, $3 key text, $4 key bytes,
// $5 payload JSON text, $6 value bytes, $7 headers JSON text, $8 partitions,
// $9 offsets, $10 timestamps (ms, -1: none), $11 and $12 the headers'
// names and values (bytea[] literals, one per record).  An id is unique
// per topic: the same id on another topic is another record.  A producer
// sets the
// timestamp it likes: one past the year 9999 (Postgres' timestamps end in
// 294276) is stored as none rather than failing the batch again and again.
inline constexpr const char kInsert[] =
    "INSERT INTO outbox.inbox_message"
    " (event_id, topic, key, key_bytes, payload, value, headers, kafka_partition, kafka_offset,"
    " kafka_timestamp, header_names, header_values)"
    " SELECT coalesce(r.event_id::uuid,"
    " pg_catalog.md5(r.topic || '/' || r.kafka_partition || '/' || r.kafka_offset || '/' || r.ts)"
    "::uuid),"
    " r.topic, r.key, r.key_bytes, r.payload::jsonb, r.value, r.headers::jsonb,"
    " r.kafka_partition, r.kafka_offset,"
    " CASE WHEN r.ts BETWEEN 0 AND 253402300799999 THEN pg_catalog.to_timestamp(r.ts::float8 / 1000) END,"
    " r.hn::bytea[], r.hv::bytea[]"
    " FROM ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[]),"
    " pg_catalog.unnest($3::text[]), pg_catalog.unnest($4::bytea[]),"
    " pg_catalog.unnest($5::text[]), pg_catalog.unnest($6::bytea[]),"
    " pg_catalog.unnest($7::text[]), pg_catalog.unnest($8::int4[]),"
    " pg_catalog.unnest($9::int8[]), pg_catalog.unnest($10::int8[]),"
    " pg_catalog.unnest($11::text[]), pg_catalog.unnest($12::text[]))"
    " AS r(event_id, topic, key, key_bytes, payload, value, headers, kafka_partition,"
    " kafka_offset, ts, hn, hv)"
    " ON CONFLICT (event_id, topic) DO NOTHING";

// One record whose payload Postgres' jsonb refuses (say a \u0000 escape):
// its JSON is kept as text, its bytes in value; never dropped.  Arguments as
// kInsert's, one each.
inline constexpr const char kInsertRaw[] =
    "INSERT INTO outbox.inbox_message"
    " (event_id, topic, key, key_bytes, payload, value, headers, kafka_partition, kafka_offset,"
    " kafka_timestamp, header_names, header_values)"
    " VALUES (coalesce($1::uuid,"
    " pg_catalog.md5($2 || '/' || $8 || '/' || $9 || '/' || $10)::uuid),"
    " $2, $3, $4, pg_catalog.jsonb_build_object('raw_text', $5::text), $6, $7::jsonb, $8, $9,"
    " CASE WHEN $10 BETWEEN 0 AND 253402300799999 THEN pg_catalog.to_timestamp($10::float8 / 1000)"
    " END, $11::bytea[], $12::bytea[])"
    " ON CONFLICT (event_id, topic) DO NOTHING";

// Records of topic $1 whose event_id header could not be their id: $2 more,
// the last one's note $3 (the consumer's own words, never a record's data).
inline constexpr const char kNoteIntake[] =
    "INSERT INTO outbox.inbox_intake AS i (topic, derived_event_ids, last_note, last_note_at)"
    " VALUES ($1, $2, $3, pg_catalog.now())"
    " ON CONFLICT (topic) DO UPDATE SET"
    " derived_event_ids = i.derived_event_ids + excluded.derived_event_ids,"
    " last_note = excluded.last_note, last_note_at = excluded.last_note_at";

// Every subscription: the topic, its handler, the handler's owner (it runs
// as that role), whether it takes a batch (outbox.inbox_message[]), and
// whether the subscription's owner may still have it run (a superuser, or a
// role with the privileges of the function's owner).  A handler that no
// longer exists has a NULL owner.  The handler is looked up by its
// signature (text from schema 1.6, a regprocedure before: its text under
// the workers' pinned search_path is qualified, so both read alike), and
// its signature comes back for the messages.
inline constexpr const char kSubscriptions[] =
    "SELECT s.topic, p.oid, p.proowner,"
    " p.proargtypes[0] OPERATOR(pg_catalog.<>) 'outbox.inbox_message'::pg_catalog.regtype,"
    " ((SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.oid = s.owner)"
    " OR pg_catalog.pg_has_role(s.owner, p.proowner, 'USAGE'))"
    " AND (s.handler_owner IS NULL OR s.handler_owner OPERATOR(pg_catalog.=) p.proowner),"
    " s.handler::pg_catalog.text, s.owner::pg_catalog.oid,"
    " EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.oid = s.owner)"
    " FROM outbox.inbox_subscription s LEFT JOIN pg_catalog.pg_proc p"
    " ON p.oid = pg_catalog.to_regprocedure(s.handler::pg_catalog.text)"
    " ORDER BY s.topic";
// The same before schema 1.6 (no handler_owner; the handler a regprocedure).
inline constexpr const char kSubscriptionsBefore16[] =
    "SELECT s.topic, p.oid, p.proowner,"
    " p.proargtypes[0] OPERATOR(pg_catalog.<>) 'outbox.inbox_message'::pg_catalog.regtype,"
    " (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.oid = s.owner)"
    " OR pg_catalog.pg_has_role(s.owner, p.proowner, 'USAGE'),"
    " s.handler::pg_catalog.text, s.owner::pg_catalog.oid,"
    " EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.oid = s.owner)"
    " FROM outbox.inbox_subscription s LEFT JOIN pg_catalog.pg_proc p"
    " ON p.oid = pg_catalog.to_regprocedure(s.handler::pg_catalog.text)"
    " ORDER BY s.topic";

enum SubscriptionColumn {
    kSubTopic = 1,
    kSubHandler,
    kSubFunctionOwner,
    kSubBatch,
    kSubAllowed,
    kSubHandlerName,
    kSubSubscriber,        // the role that subscribed the topic (its OID)
    kSubSubscriberExists,  // false once that role was dropped
};

// Keys of topic $1 whose earliest unprocessed record waits for a retry:
// their later records wait behind it.
inline constexpr const char kRetryingKeys[] =
    "SELECT DISTINCT key FROM outbox.inbox_message"
    " WHERE NOT processed AND next_attempt_at IS NOT NULL AND topic = $1"
    " AND next_attempt_at > pg_catalog.now() AND parked_at IS NULL AND key IS NOT NULL";

// A handler's claim: unprocessed records of topic $2 in arrival order, of
// this worker's share ($4 of $3: by key, so a key's records stay with one
// worker; a record without a key by its event id), skipping parked ones,
// ones waiting for a retry, and keys with an earlier record waiting ($5).
// Its one right plan walks ix_inbox_message_unprocessed_topic in order;
// the handler worker runs its own statements with sorts off, because a
// generic plan otherwise walks the received_at index and sorts each
// batch's records (they share one received_at) on every claim: a few
// records a second on a burst of one topic (sql/plans.sql).
inline constexpr const char kClaim[] =
    "SELECT m, m.event_id, m.key FROM outbox.inbox_message m"
    " WHERE NOT m.processed AND m.topic = $2 AND m.parked_at IS NULL"
    " AND (m.next_attempt_at IS NULL OR m.next_attempt_at <= pg_catalog.now())"
    " AND (pg_catalog.hashtext(coalesce(m.key, m.event_id::text)) & 2147483647) % $3 = $4"
    " AND (m.key IS NULL OR m.key <> ALL($5))"
    " ORDER BY m.received_at, m.seq LIMIT $1"
    " FOR UPDATE SKIP LOCKED";

enum ClaimColumn { kClaimRow = 1, kClaimEventId, kClaimKey };

// When the earliest retry of this worker's share is due.
inline constexpr const char kNextRetry[] =
    "SELECT min(next_attempt_at) FROM outbox.inbox_message"
    " WHERE NOT processed AND next_attempt_at IS NOT NULL AND parked_at IS NULL";

inline constexpr const char kDone[] =
    "UPDATE outbox.inbox_message SET processed = true,"
    " processed_at = pg_catalog.clock_timestamp(), next_attempt_at = NULL"
    " WHERE event_id = ANY($1) AND topic = $2";

// A failed handler call: one attempt more, the error kept, a retry after
// $4 seconds doubling with each failure up to $5, parked at the $3rd
// failure.  $6: the record's topic.
inline constexpr const char kFailed[] =
    "UPDATE outbox.inbox_message SET attempts = attempts + 1, last_error = $2,"
    " next_attempt_at = CASE WHEN attempts + 1 >= $3 THEN NULL ELSE pg_catalog.clock_timestamp()"
    " + pg_catalog.make_interval(secs => LEAST($5::float8,"
    " $4::float8 * pg_catalog.power(2::float8, attempts::float8))) END,"
    " parked_at = CASE WHEN attempts + 1 >= $3 THEN pg_catalog.clock_timestamp() END"
    " WHERE event_id = $1 AND topic = $6 RETURNING parked_at IS NOT NULL";

}  // namespace outbox::sql::inbox

namespace outbox::sql::inbox_api {

// The subscription of topic $1: its owner and its handler's owner.
inline constexpr const char kSubscriptionOf[] =
    "SELECT s.owner::pg_catalog.oid,"
    " (SELECT p.proowner FROM pg_catalog.pg_proc p"
    " WHERE p.oid = pg_catalog.to_regprocedure(s.handler::pg_catalog.text))"
    " FROM outbox.inbox_subscription s WHERE s.topic = $1";

// $2 is the handler as a regprocedure, $4 its owner: the text column of schema 1.6 takes
// it as text, schema-qualified (inbox_subscribe() runs with search_path
// pg_catalog), the regprocedure column before as it is.
inline constexpr const char kSubscribe[] =
    "INSERT INTO outbox.inbox_subscription AS s (topic, handler, owner, handler_owner)"
    " VALUES ($1, $2::pg_catalog.regprocedure, $3, $4)"
    " ON CONFLICT (topic) DO UPDATE SET handler = excluded.handler, owner = excluded.owner,"
    " handler_owner = excluded.handler_owner, created_at = pg_catalog.now()";
// Before schema 1.6 (no handler_owner).
inline constexpr const char kSubscribeBefore16[] =
    "INSERT INTO outbox.inbox_subscription AS s (topic, handler, owner)"
    " VALUES ($1, $2::pg_catalog.regprocedure, $3)"
    " ON CONFLICT (topic) DO UPDATE SET handler = excluded.handler, owner = excluded.owner,"
    " created_at = pg_catalog.now()";

inline constexpr const char kUnsubscribe[] =
    "DELETE FROM outbox.inbox_subscription WHERE topic = $1";

}  // namespace outbox::sql::inbox_api
