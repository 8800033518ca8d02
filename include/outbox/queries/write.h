// outbox.write*()'s statements (texts in write_sql.h).  Postgres-side:
// inside a transaction with SPI connected; each may ereport(ERROR).
#pragma once

#include "outbox/pg.h"

extern "C" {
#include "utils/uuid.h"
}

struct OutboxNewMessage {
    const pg_uuid_t *message_id;
    Datum topic;    // text
    Datum key;      // text: the key column (orders the key's messages on its topic)
    bool keyless;   // write_bytes() without a key: the key column is NULL (schema 1.6)
    Datum payload;  // jsonb
    Datum headers;  // jsonb
    bool has_partition;
    int32 partition;
    bool is_binary;  // written by write_bytes(): key_bytes and value are the record
    bool has_key_bytes;
    Datum key_bytes;  // bytea
    bool has_value;
    Datum value;  // bytea
};

// Inserts the message; returns its id.
int64 outbox_insert_message(const OutboxNewMessage *m);

// Moves the id sequence past the table's highest id if it is behind (a
// restore from a dump that did not carry it).  Cheap enough for once per
// backend; serialized with an advisory lock it never waits for.  False
// when another backend held that lock and nothing was checked.
bool outbox_heal_id_sequence(void);
