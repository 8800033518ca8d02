// The maintenance worker's SQL (src/queries/retention.cpp runs it).  Pure
// C++: texts only.
#pragma once

#include "outbox/queries/relay_sql.h"  // OUTBOX_CLAIMABLE

namespace outbox::sql::retention {

// Old rows, a batch at a time, oldest first.  Each locks only the rows it
// deletes, skips rows someone else holds, and rechecks the condition on the
// locked row, so a row replayed meanwhile (published_at reset) is never
// deleted.  $1: the cutoff, $2: the batch size, $3: where the batch starts
// (past what the pass deleted already, so that it never walks those dead
// index entries again), $4 (published rows): an id no row old enough lies
// beyond, so that the last batch of a pass does not walk the retention
// window.  Each returns the key it went by, for the next batch's start.
inline constexpr const char kRetentionPublished[] =
    "DELETE FROM outbox.outbox_message WHERE id IN ("
    "SELECT id FROM outbox.outbox_message WHERE id >= $3 AND id < $4 AND published_at < $1"
    " ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)"
    " AND published_at < $1 RETURNING id";

inline constexpr const char kRetentionProcessedEvents[] =
    "DELETE FROM outbox.processed_event WHERE event_id IN ("
    "SELECT event_id FROM outbox.processed_event WHERE expires_at >= $3 AND expires_at < $1"
    " ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)"
    " AND expires_at < $1 RETURNING expires_at";

inline constexpr const char kRetentionInbox[] =
    "DELETE FROM outbox.inbox_message WHERE (event_id, topic) IN ("
    "SELECT event_id, topic FROM outbox.inbox_message"
    " WHERE processed AND processed_at >= $3 AND processed_at < $1"
    " ORDER BY processed_at LIMIT $2 FOR UPDATE SKIP LOCKED)"
    " AND processed AND processed_at < $1 RETURNING processed_at";

// The id of the first message written at or after a time ($1: the smallest
// version 7 UUID of that millisecond): message ids are time-ordered, so
// rows old enough to delete lie below it (give or take the few written
// while it was taken, which the next pass gets).
inline constexpr const char kFirstIdSince[] =
    "SELECT id, message_id FROM outbox.outbox_message WHERE message_id >= $1"
    " ORDER BY message_id LIMIT 1";

// The straggler scan (outbox/low_water.h): the relays' low-water mark
// passed rows it never saw if one of these exists: pending, not parked, below the lowest mark ($1), and unless
// nothing waits for a retry ($2), neither waiting nor behind a message of
// its key that waits (the mark passes those on purpose).
inline constexpr const char kStraggler[] =
    "SELECT id FROM outbox.outbox_message m"
    " WHERE published_at IS NULL AND parked_at IS NULL AND id < $1"
    " AND ($2 OR " OUTBOX_CLAIMABLE ")"
    " ORDER BY id LIMIT 1";

// The same on a schema before 1.3 (no message waits there).
inline constexpr const char kStragglerBefore13[] =
    "SELECT id FROM outbox.outbox_message"
    " WHERE published_at IS NULL AND parked_at IS NULL AND id < $1"
    " ORDER BY id LIMIT 1";

}  // namespace outbox::sql::retention
