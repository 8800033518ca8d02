// Checks of SQL functions' arguments shared by outbox.write*() and the
// inbox's functions.  Postgres-side: each ereports(ERROR) on bad input.
#pragma once

#include "outbox/pg.h"

// ERROR 22004: "<function>: <name> must not be NULL".
[[noreturn]] void outbox_null_argument(const char *function, const char *name);

// ERROR 22023 when Kafka would refuse `topic` as a topic name, saying why.
void outbox_check_topic(const char *function, text *topic);
// ERROR when `topic` is one of Kafka's internal topics (a name beginning
// with "__": __consumer_offsets, __transaction_state), or
// outbox.progress_topic: the exactly-once relays' own records are there,
// and a message keyed like one of their ids could become its last progress
// record.
void outbox_check_writable_topic(const char *function, text *topic);
