// The inbox's statements (texts in inbox_sql.h).  Postgres-side: inside a
// transaction with SPI connected; each may ereport(ERROR).
#pragma once

#include "outbox/pg.h"
#include "outbox/share.h"

extern "C" {
#include "utils/timestamp.h"
}

// One consumed record, ready to store: text in the server's encoding.
struct OutboxInboxRow {
    const char *event_id;  // nullptr: derive one
    const char *topic;
    const char *key;    // nullptr: no key
    bytea *key_bytes;   // the key's exact bytes; nullptr: no key
    const char *payload;  // JSON text
    bytea *value;         // the value's exact bytes; nullptr: a tombstone
    const char *headers;  // JSON object text
    const char *header_names;   // bytea[] literal: the headers' names as bytes, in order
    const char *header_values;  // bytea[] literal: their values (NULL: none)
    const char *event_id_note;  // why the event_id header was not the id; nullptr: no note
    int32 partition;
    int64 offset;
    int64 timestamp;  // ms; -1: none
};

// Stores records (a known event id dropped); returns the rows inserted.
// Errors when a payload is not valid jsonb: see outbox_inbox_insert_raw().
int64 outbox_inbox_insert(const OutboxInboxRow *rows, int n);
// Stores one record with its payload kept as {"raw_text": ...}.
int64 outbox_inbox_insert_raw(const OutboxInboxRow *row);
// Adds `n` records of `topic` whose event_id header could not be their id
// to outbox.inbox_intake, with the last one's note.
void outbox_inbox_note_intake(const char *topic, int64 n, const char *note);

struct OutboxSubscription {
    char *topic;
    Oid handler;   // InvalidOid when its signature resolves to no function
    char *handler_name;  // its signature, as subscribed
    Oid owner;     // the handler function's owner: it runs as that role
    bool exists;   // the function is still there
    bool batch;    // it takes outbox.inbox_message[]
    bool allowed;  // the subscription's owner may have it run
    Oid subscriber;          // the role that subscribed the topic
    bool subscriber_exists;  // false once that role was dropped
};

// Every subscription, by topic (`schema`: the extension's, as
// outbox_schema_version() gives it).
int outbox_inbox_subscriptions(int schema, OutboxSubscription **subs);

// Keys of `topic` whose earliest unprocessed record waits for a retry.
char **outbox_inbox_retrying_keys(const char *topic, int *n);

struct OutboxInboxClaim {
    Datum row;       // the outbox.inbox_message row, for the handler
    Datum event_id;  // uuid
    char *key;       // nullptr: no key
};

// Claims up to `limit` unprocessed records of `topic` of key share
// `share`, skipping `blocked` keys, in arrival order, and no more than
// `byte_budget` bytes of them (the first always comes).  SPI memory, valid
// until SPI_finish.
int outbox_inbox_claim(const char *topic, int limit, OutboxShare share, char **blocked,
                       int nblocked, int64 byte_budget, OutboxInboxClaim **rows);

// Marks records of `topic` processed.
void outbox_inbox_done(const char *topic, const Datum *event_ids, int n);

// Records a failed handler call on a record of `topic`; true when that
// parked the record.
bool outbox_inbox_failed(const char *topic, Datum event_id, const char *error, int max_attempts);

// When the earliest retry is due, or 0.
TimestampTz outbox_inbox_next_retry(void);
