// Shared memory: one slot per background worker of the extension.  A slot
// carries what other processes need: the worker's latch and database (a
// committing backend wakes the relay of its database) and its counters (the
// stats views read them without touching any table).
#pragma once

#include "outbox/pg.h"

extern "C" {
#include "utils/timestamp.h"
}

enum OutboxWorkerRole {
    OUTBOX_ROLE_RELAY = 1,
    OUTBOX_ROLE_MAINTENANCE = 2,
    OUTBOX_ROLE_INBOX_CONSUMER = 3,
    OUTBOX_ROLE_INBOX_HANDLER = 4,
};

enum OutboxBrokerState {
    OUTBOX_BROKER_UNKNOWN = 0,
    OUTBOX_BROKER_UP = 1,
    OUTBOX_BROKER_DOWN = 2,
};

// Asks for the shared memory (from _PG_init while preloading).
void outbox_shmem_init(void);

// Number of slots: every worker the configuration registers.
int outbox_slot_count(void);

// The calling worker publishes its latch, role and database in slot `index`
// (cleared again when the process exits).  `share` is a relay's key share.
void outbox_slot_attach(int index, OutboxWorkerRole role, int share, Oid database);

// Sets the latch of every worker of `role` serving `database`.  Safe from any
// backend, also when the library was not preloaded (then a no-op).
void outbox_wake(OutboxWorkerRole role, Oid database);

// Counters of the calling worker's slot.  `processed` is what the role
// does: messages published (relay), rows deleted (maintenance), records
// stored (inbox consumer), messages handled (inbox handler).
void outbox_stats_add(uint64 processed, uint64 failed, uint64 parked);
void outbox_stats_set_in_flight(uint64 in_flight);
void outbox_stats_set_broker_state(OutboxBrokerState state);
void outbox_stats_error(const char *text);

// ---- the relay's low-water mark ----
//
// A relay claims from a low-water mark: every row below it is published or
// parked, so the claim never walks the dead index entries that a long
// snapshot (pg_dump, a report) keeps there.  What may still appear below
// the mark: rows of transactions that have not committed yet.  Every
// backend that writes through outbox.write*() says so here before its
// first insert of a transaction (outbox_writer_allocating) and gives its
// lowest id right after (outbox_writer_wrote); the commit callback clears
// it.  The relay keeps its mark at or below every such id.  Rows inserted
// any other way (COPY, a direct INSERT, COMMIT PREPARED) are found by the
// maintenance worker's straggler scan, which lowers the mark again
// (outbox_relay_rescan_from), as outbox.retry() and outbox.replay() do.

// Before this transaction's first outbox insert.
void outbox_writer_allocating(void);
// After each insert: `id` is the row's id.
void outbox_writer_wrote(int64 id);
// At the end of the transaction (commit, abort, prepare).
void outbox_writer_done(void);
// The lowest id of an uncommitted outbox insert in `database`, or
// PG_INT64_MAX; *unsure when a writer is between announcing and inserting.
int64 outbox_writers_lowest(Oid database, bool *unsure);

// Lowers the low-water mark of every relay of `database` to `id` (0: back
// to the start); the relays apply it at their next claim.
void outbox_relay_rescan_from(Oid database, int64 id);
// For a relay: the lowest rescan point asked since the last call, or
// PG_INT64_MAX.
int64 outbox_relay_take_rescan(void);
// A relay publishes its mark; the straggler scan looks below the lowest.
void outbox_relay_set_low_water(int64 low_water);
int64 outbox_relays_lowest_low_water(Oid database);

// One slot's counters, copied out under its lock.
struct OutboxSlotStats {
    int role;
    int share;
    pid_t pid;
    Oid database;
    TimestampTz started_at;
    TimestampTz last_activity_at;
    uint64 processed;
    uint64 processed_last_minute;
    uint64 failed;
    uint64 parked;
    uint64 batches;
    uint64 in_flight;
    int broker_state;
    TimestampTz last_error_at;
    char last_error[256];
};

// Copies slot `index`; false when it is free (no worker attached).
bool outbox_slot_stats(int index, OutboxSlotStats *out);
