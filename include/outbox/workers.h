// Which background workers the configuration asks for, and where each one's
// shared memory slot is.  Fixed at server start (outbox.database,
// outbox.workers, outbox.inbox and outbox.inbox_workers are restart-only).
//
// The slots of database d (in the order outbox.database lists them) form
// one block:  relay shares 0..W-1, the maintenance worker, then with the
// inbox the consumer and the handler shares 0..H-1 (W = outbox.workers,
// H = outbox.inbox_workers).  A worker's slot is its bgw_main_arg.
#pragma once

#include "outbox/pg.h"
#include "outbox/shmem.h"

inline constexpr int kOutboxMaxDatabases = 16;

// What a worker of `role` is called: "relay", "maintenance", "inbox
// consumer", "inbox handler" (outbox.worker_stats.role; the process is
// "pg outbox <name>"); "unknown" for a value that is no role.
const char *outbox_role_name(int role);

// The databases of outbox.database.
int outbox_database_count(void);
const char *outbox_database_name(int index);

// The slot of a worker, and back.
int outbox_slot_of(OutboxWorkerRole role, int database_index, int share);
void outbox_slot_identity(int slot, OutboxWorkerRole *role, int *database_index, int *share);

// Workers of `role` per database.
int outbox_shares(OutboxWorkerRole role);

// Registers every worker (from _PG_init while preloading).
void outbox_register_workers(void);

// Whether the workers serve the current database (the library is preloaded
// and outbox.database lists it).
bool outbox_serves_this_database(void);

extern "C" {
PGDLLEXPORT void outbox_relay_main(Datum main_arg);
PGDLLEXPORT void outbox_maintenance_main(Datum main_arg);
PGDLLEXPORT void outbox_inbox_consumer_main(Datum main_arg);
PGDLLEXPORT void outbox_inbox_handler_main(Datum main_arg);
}
