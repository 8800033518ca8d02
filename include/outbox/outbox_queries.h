// Every SQL statement the extension runs, as saved SPI plans.  All
// functions here must be called inside a transaction with SPI connected;
// they ereport(ERROR) on failure like any Postgres call.
#pragma once

#include "outbox/pg.h"
#include "outbox/kafka/producer.h"
#include "outbox/sql_text.h"

extern "C" {
#include "storage/itemptr.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"
}


// True when CREATE EXTENSION outbox has run in this database.
bool outbox_extension_ready(void);

// Claims up to `limit` pending rows of share `worker` of `nworkers`,
// skipping the keys in `skip_keys` (a text[]), and returns them in id order
// as records pointing into SPI memory, valid until SPI_finish, with their
// ctids (the claim locked them: valid until the transaction ends).
int outbox_claim_batch(int limit, int nworkers, int worker, Datum skip_keys,
                       outbox::kafka::Record **records, ItemPointerData **ctids);

// Sets published_at on rows this transaction claimed, by ctid.
void outbox_mark_claimed_published(const ItemPointerData *ctids, int n);

// A text[] datum of n strings (not NUL-terminated: lengths given).
Datum outbox_text_array(const char *const *values, const std::size_t *lengths, int n);

// Sets published_at on rows Kafka acknowledged, by id (any transaction).
void outbox_mark_published(const int64 *ids, int n);

// Counts one failed attempt on each row and keeps its error text; parks a
// row refused for good (`permanent`) for the max_attempts-th time, logs
// each row it parks, and returns how many it parked.
int outbox_record_failures(const int64 *ids, const char *const *errors, const bool *permanent,
                            int n, int max_attempts);

enum OutboxRetention {
    OUTBOX_RETENTION_PUBLISHED,         // outbox rows published before the cutoff
    OUTBOX_RETENTION_PROCESSED_EVENTS,  // processed_event rows expired before the cutoff
    OUTBOX_RETENTION_INBOX,             // inbox rows processed before the cutoff
};

// Deletes up to `limit` rows of `which` older than `cutoff`; returns how many.
int64 outbox_retention_delete(OutboxRetention which, TimestampTz cutoff, int limit);

// outbox.write()'s insert.
void outbox_insert_message(const pg_uuid_t *message_id, Datum topic, Datum key, Datum payload,
                           Datum headers);
