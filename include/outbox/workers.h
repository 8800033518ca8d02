// Which background workers the configuration asks for, and where each one's
// shared memory slot is.  Fixed at server start (outbox.database and
// outbox.workers are restart-only).
//
// Per database d of outbox.database (in the order listed):
//   relay share w   slot d * outbox.workers + w
//   maintenance     slot ndb * outbox.workers + d
//   inbox consumer  slot ndb * (outbox.workers + 1) + d        (outbox.inbox = on)
//   inbox handler   slot ndb * (outbox.workers + 2) + d        (outbox.inbox = on)
#pragma once

#include "outbox/pg.h"

inline constexpr int kOutboxMaxDatabases = 16;

// The databases of outbox.database.
int outbox_database_count(void);
const char *outbox_database_name(int index);

int outbox_relay_slot(int database_index, int share);
int outbox_maintenance_slot(int database_index);
int outbox_inbox_consumer_slot(int database_index);
int outbox_inbox_handler_slot(int database_index);

// For a relay's slot: its database index and key share.
void outbox_relay_of_slot(int slot, int *database_index, int *share);

// Parses an outbox.database value; false with a sentence in `why` when it
// is not a comma-separated list of 1..16 distinct database names.
bool outbox_parse_database_list(const char *value, char names[][NAMEDATALEN], int *count,
                                const char **why);

// Registers every worker (from _PG_init while preloading).
void outbox_register_workers(void);
