// Every SQL statement the extension runs, as saved SPI plans.  All
// functions here must be called inside a transaction with SPI connected;
// they ereport(ERROR) on failure like any Postgres call.
#pragma once

#include "outbox/pg.h"
#include "outbox/kafka/producer.h"
#include "outbox/sql_text.h"

extern "C" {
#include "utils/uuid.h"
}


// True when CREATE EXTENSION outbox has run in this database.
bool outbox_extension_ready(void);

// Claims up to `limit` pending rows (share `worker` of `nworkers`) and
// returns them as records pointing into SPI memory, valid until SPI_finish.
int outbox_claim_batch(int limit, int nworkers, int worker, outbox::kafka::Record **records);

// Sets published_at on the rows Kafka acknowledged.
void outbox_mark_published(const int64 *ids, int n);

// Counts one failed attempt on each row and keeps its error text.
void outbox_record_failures(const int64 *ids, const char *const *errors, int n);

// outbox.write()'s insert.
void outbox_insert_message(const pg_uuid_t *message_id, Datum topic, Datum key, Datum payload,
                           Datum headers);
