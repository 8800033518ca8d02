// What every background worker of the extension does the same way: its
// transactions, recovering from an ERROR, sleeping on its latch and a
// librdkafka wake-up pipe.
#pragma once

#include "outbox/pg.h"

extern "C" {
#include "storage/latch.h"
}

// Starts a transaction with SPI connected and a snapshot, reporting
// `activity` in pg_stat_activity.
void outbox_worker_begin(const char *activity);

// Commits it and switches back to `context` (commit leaves
// TopMemoryContext current).
void outbox_worker_commit(MemoryContext context);

// The recovery a backend does for a failed command, for a worker's
// PG_CATCH block: the error goes to the log and the worker's stats slot,
// the transaction is aborted, the error state flushed; `context` current.
void outbox_worker_recover(MemoryContext context);

// A wait set of the latch, postmaster death (the worker exits) and, when
// pipe_fd >= 0, the read end of a wake-up pipe.
WaitEventSet *outbox_worker_wait_set(int pipe_fd);

// Sleeps on `set` up to timeout_ms (-1: no limit).  Resets the latch and
// empties the pipe; returns true when the latch was set.
bool outbox_worker_wait(WaitEventSet *set, int pipe_fd, long timeout_ms);

// Runs fn(arg) in a subtransaction of the current transaction (with SPI
// connected).  On an ERROR only the subtransaction is rolled back: returns
// false with the error's message, palloc'd, in *error.
bool outbox_worker_subtransaction(void (*fn)(void *), void *arg, char **error);

// A non-blocking pipe for librdkafka's wake-ups; FATAL when none can be had.
void outbox_worker_pipe(int fds[2], const char *label);
