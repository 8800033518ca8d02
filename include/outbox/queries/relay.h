// The relay's statements (texts in relay_sql.h).  Postgres-side: inside a
// transaction with SPI connected; each may ereport(ERROR).
#pragma once

#include "outbox/kafka/producer.h"

#include "outbox/pg.h"
#include "outbox/share.h"

extern "C" {
#include "storage/itemptr.h"
#include "utils/timestamp.h"
}

struct OutboxClaim {
    // The rows to produce, in id order, pointing into SPI memory (valid
    // until SPI_finish), with where each one is (the claim locked them).
    outbox::kafka::Record *records;
    ItemPointerData *ctids;
    int n;
    // Rows the claim returned (and locked) beyond records[n - 1]: the byte
    // budget stopped at them.  They stay pending.
    int left;
};

// Claims up to `limit` pending rows at or above `low_water` of key share
// `share`, skipping the keys of `skip_keys` (a text[]), and
// prepares them for Kafka: each payload rendered as JSON text, text in
// UTF-8 whatever the server's encoding, no more than `byte_budget` bytes of
// values in all (the first row always goes).  A row whose payload cannot be
// rendered gets Record::error instead.  `schema`: outbox_schema_version().
// `waiting`: some message may wait for a retry (schema 1.3): the claim then
// skips the rows that wait and the later rows of their keys.
void outbox_relay_claim(int schema, int limit, int64 low_water, OutboxShare share,
                        Datum skip_keys, bool waiting, int64 byte_budget, OutboxClaim *out);

// The first pending (unparked) row at or above `from` that a claim may take
// (`waiting` as for the claim), or -1.
int64 outbox_relay_first_pending(int schema, int64 from, bool waiting);

// Messages waiting for a retry (schema 1.3): when the next is due (0: none
// waits), and the lowest id of those due now (-1: none).
TimestampTz outbox_relay_next_retry(void);
int64 outbox_relay_first_due(void);

// The last id the message id sequence handed out (0 before the first).
int64 outbox_relay_last_id(void);

// Marks rows Kafka acknowledged: by ctid the rows this transaction's claim
// locked, by id any others.
// Where Kafka wrote the records of a mark (schema 1.6: the rows keep
// them), one entry per row marked.  A null OutboxPlaces: the places are
// not known (a schema before 1.6, or rows of a transaction that recovery
// settles from the progress topic): published_at alone is set.
struct OutboxPlaces {
    const int32 *partitions;
    const int64 *offsets;
};
void outbox_relay_mark_claimed(const ItemPointerData *ctids, const OutboxPlaces *at, int n);
void outbox_relay_mark_by_id(const int64 *ids, const OutboxPlaces *at, int n);

// Counts a failed attempt on each row, keeps its error text, parks it when
// `park_now` or when Kafka refused it for good (`permanent`) for the
// max_attempts-th time (before that, on schema 1.3, it waits for its next
// attempt); logs each row it parks; returns how many.  *first_parked: the
// lowest id parked now (else unchanged); *next_due: the earliest retry it
// set (else unchanged).
int outbox_relay_record_failures(int schema, const int64 *ids, const char *const *errors,
                                 const bool *permanent, const bool *park_now, int n,
                                 int max_attempts, const char *label, int64 *first_parked,
                                 TimestampTz *next_due);
