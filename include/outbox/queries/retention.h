// The maintenance worker's statements (texts in retention_sql.h).
// Postgres-side: inside a transaction with SPI connected; may ereport(ERROR).
#pragma once

#include "outbox/pg.h"

extern "C" {
#include "utils/timestamp.h"
}

enum OutboxRetention {
    OUTBOX_RETENTION_PUBLISHED,         // outbox rows published before the cutoff
    OUTBOX_RETENTION_PROCESSED_EVENTS,  // processed_event rows expired before the cutoff
    OUTBOX_RETENTION_INBOX,             // inbox rows processed before the cutoff
};

// Deletes up to `limit` rows of `which` older than `cutoff`; returns how
// many.  Published outbox rows are taken in id order from `*from_id`, which
// moves past what was deleted (so one pass never walks the same dead index
// entries twice).
int64 outbox_retention_delete(OutboxRetention which, TimestampTz cutoff, int limit,
                              int64 *from_id);

// The lowest pending (unparked) outbox row below `below`, or -1: a row the
// relays' low-water mark passed without seeing it (inserted without
// outbox.write*(), or committed by COMMIT PREPARED).  Unless nothing is
// `waiting` for a retry, rows that wait and the rows behind them are not
// stragglers (the mark passes them on purpose).
int64 outbox_straggler_below(int schema, int64 below, bool waiting);
