// outbox.write()'s SQL (src/queries/write.cpp runs it).  Pure C++.
#pragma once

namespace outbox::sql::write {

// A message of outbox.write() without an explicit partition: only the
// columns every schema version has, so that a database not yet updated
// with ALTER EXTENSION outbox UPDATE keeps working.
inline constexpr const char kInsert[] =
    "INSERT INTO outbox.outbox_message (message_id, topic, key, payload, headers)"
    " VALUES ($1, $2, $3, $4, $5) RETURNING id";

// Any message of schema 1.2: a partition, or Kafka bytes (is_binary).
inline constexpr const char kInsertFull[] =
    "INSERT INTO outbox.outbox_message (message_id, topic, key, payload, headers,"
    " kafka_partition, is_binary, key_bytes, value)"
    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id";

// After a restore from a dump that did not carry the id sequence (made by
// pg outbox before 1.2), the sequence is behind the table and every insert
// would fail on the primary key: move it to the highest id.  Run once per
// backend, under a lock (two backends doing it at once could otherwise move
// the sequence back); setval() runs only when the table is ahead of it.
inline constexpr const char kHealSequence[] =
    "SELECT pg_catalog.setval(s.seq, m.max_id)"
    " FROM (SELECT pg_catalog.pg_get_serial_sequence('outbox.outbox_message', 'id')"
    "::pg_catalog.regclass AS seq) s,"
    " LATERAL (SELECT pg_catalog.max(id) AS max_id FROM outbox.outbox_message) m"
    " WHERE m.max_id > coalesce(pg_catalog.pg_sequence_last_value(s.seq), 0)";

}  // namespace outbox::sql::write
