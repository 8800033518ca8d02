// Shared memory: one slot per background worker of the extension.  A slot
// carries what other processes need: the worker's latch and database (a
// committing backend wakes the relay of its database) and its counters (the
// stats views read them without touching any table).
#pragma once

#include "outbox/pg.h"

extern "C" {
#include "utils/timestamp.h"
#include "utils/uuid.h"
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
// What the worker's work waits for, in a sentence (nullptr or "": nothing):
// a relay holding batches until a standby has their WAL.
void outbox_stats_waiting(const char *text);

// The relays' low-water mark and rescan point live in their slots too:
// their functions are declared in outbox/low_water.h.

// ---- an inbox handler's call in progress ----
//
// A handler call can end its worker's process: a FATAL it raises (say with
// exit_on_error on), or a call that ignored its cancellation and was ended.
// The slot keeps the call's records across the restart, so that the next
// process counts the call as a failed attempt (and parks the records after
// outbox.max_attempts) instead of calling it again for ever.

// Before a call: its records' topic and event ids (uuid Datums).
void outbox_call_begin(const char *topic, const Datum *event_ids, int n);
// After it, however it ended without ending the process.
void outbox_call_end(void);
// The call is ending the process: why (`timed_out`: it ran past its time
// and ignored its cancellation; that reason is kept over any later one).
// Async-signal-safe for timed_out with a constant text.
void outbox_call_note_end(const char *text, bool timed_out);
// The process is stopping because it was asked to (SIGTERM): the call is
// not counted, unless it had run past its time already.
void outbox_call_forget_unless_timed_out(void);
// For a handler that starts: the call its previous process did not finish,
// if any: its n records (their topic and ids, palloc'd) and why it ended.
// Clears it.
int outbox_call_take_unfinished(char **topic, pg_uuid_t **ids, char *error, std::size_t len,
                                bool *timed_out);

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
    char waiting_for[256];
};

// Copies slot `index`; false when it is free (no worker attached).
bool outbox_slot_stats(int index, OutboxSlotStats *out);
