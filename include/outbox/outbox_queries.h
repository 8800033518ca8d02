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

// One consumed Kafka record for the inbox (strings NUL-terminated; a null
// event_id or key: none).
struct OutboxInboxRow {
    const char *event_id;
    const char *topic;
    const char *key;
    const char *payload;  // JSON text
    const char *headers;  // JSON object text
    int32 partition;
    int64 offset;
};

// Stores records (duplicates dropped); returns the rows inserted.  Errors
// when a payload is not valid jsonb: see outbox_inbox_insert_raw().
int64 outbox_inbox_insert(const OutboxInboxRow *rows, int n);
// Stores one record with its payload kept as {"raw_text": ...}.
int64 outbox_inbox_insert_raw(const OutboxInboxRow *row);

// ---- the inbox handler ----

// True when the inbox objects of version 1.1 exist here.
bool outbox_inbox_ready(void);

// Every subscription: topics[i] is handled by handlers[i] as run_as[i].
void outbox_inbox_subscriptions(char ***topics, Oid **handlers, Oid **run_as, int *n);

// Keys whose earliest unprocessed record waits for a retry.
char **outbox_inbox_retrying_keys(int *n);

struct OutboxInboxClaim {
    Datum row;       // the outbox.inbox_message row, for the handler
    Datum event_id;  // uuid
    char *topic;
    char *key;  // nullptr: no key
};

// Claims up to `limit` unprocessed records of `topics`, skipping `blocked`
// keys, in arrival order (SPI memory, valid until SPI_finish).
int outbox_inbox_claim(int limit, char **topics, int ntopics, char **blocked, int nblocked,
                       OutboxInboxClaim **rows);

void outbox_inbox_done(Datum event_id);

// Records a failed handler call; true when that parked the record.
bool outbox_inbox_failed(Datum event_id, const char *error, int max_attempts);

// When the earliest retry is due, or 0.
TimestampTz outbox_inbox_next_retry(void);

// outbox.write()'s insert.
void outbox_insert_message(const pg_uuid_t *message_id, Datum topic, Datum key, Datum payload,
                           Datum headers);
