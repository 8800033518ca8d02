// Shared memory: one slot per relay worker, so that a committing backend can
// find and wake the relay of its database.
#pragma once

#include "outbox/pg.h"

// Asks for the shared memory (from _PG_init while preloading).
void outbox_shmem_init(void);

// The calling relay worker publishes its latch and database in slot `index`
// and clears it again when the process exits.
void outbox_relay_slot_attach(int index, Oid database);

// Sets the latch of every relay worker serving `database`.  Safe to call
// from any backend, also when the library was not preloaded (then no-op).
void outbox_wake_relays(Oid database);
