// The relay's low-water mark, Postgres side: everything that keeps it, in
// one unit.  What the mark is, what may pass it, what brings it back and the
// ordering argument for why no committed row is left below it:
// docs/architecture.md, "The low-water mark".  The arithmetic is pure
// (outbox/common/low_water.h, unit-tested).
//
// The pieces, by who runs them:
//   writers   a backend that inserts through outbox.write*() announces the
//             lowest id of its transaction; its commit, once the rows are
//             visible, lowers every relay's rescan point to it;
//   relays    each turn starts by taking its rescan point and ends, in the
//             turn's transaction, by moving its mark up and publishing it;
//   scanner   the maintenance worker's straggler scan looks below the
//             lowest published mark for rows nobody announced;
//   rescans   outbox.retry(), retry_parked() and replay() lower the rescan
//             point to the start at their commit (wakeup.cpp).
// The mark and the rescan point live in each relay's shared memory slot
// (src/shmem.cpp); the functions marked "slot" below are implemented there.
#pragma once

#include "outbox/common/low_water.h"

#include "outbox/pg.h"

struct OutboxWorker;

// ---- writers ----

// After each insert through outbox.write*(): `id` is the row's id.
void outbox_writer_wrote(int64 id);
// At the end of the transaction: `committed` (rows visible now), or not
// (abort, prepare: COMMIT PREPARED runs elsewhere and the scan finds it).
void outbox_writer_done(bool committed);

// ---- the rescan point and the published marks (slot) ----

// Lowers the rescan point of every relay of `database` to `id` (0: back to
// the start), an atomic minimum that only the relay resets; sets their
// latches when `wake`.
void outbox_relays_lower_rescan(Oid database, int64 id, bool wake);
// For a relay: the lowest rescan point asked since the last call, or
// outbox::low_water::kNone.
int64 outbox_relay_take_rescan(void);
// A relay publishes its mark; the straggler scan looks below the lowest
// (PG_INT64_MAX: no relay).
void outbox_relay_set_low_water(int64 low_water);
int64 outbox_relays_lowest_low_water(Oid database);

// Lowers the relays' rescan point to `id` and wakes them.
void outbox_relay_rescan_from(Oid database, int64 id);

// ---- a relay's turn ----

// At the start of the turn, before its claim: the mark goes back to the
// rescan point announced since the last turn.
void outbox_low_water_start_turn(outbox::low_water::Mark *mark);
// At the end of the turn's transaction, after its marks: moves the mark up
// to the first row a claim may take (`waiting` as for the claim) and
// publishes it.  Inside a transaction with SPI connected.
void outbox_low_water_end_turn(outbox::low_water::Mark *mark, int schema, bool waiting);

// ---- the straggler scan (maintenance worker) ----

// Looks for a pending row below the relays' lowest mark, in a transaction
// of its own, and sends the relays back to it.  Returns how long to wait
// before the next scan, in ms, or -1 when it did not scan (no relay's mark
// to look below, or no extension here): the caller looks again within a
// second.
long outbox_straggler_scan(OutboxWorker *w);
