// The relay's low-water mark, Postgres side (outbox/low_water.h); the
// design is docs/architecture.md, "The low-water mark".  Postgres-side code
// only: an ERROR ends the worker (worker_common.h).

#include "outbox/low_water.h"

#include "outbox/guc.h"
#include "outbox/policy.h"
#include "outbox/queries/relay.h"
#include "outbox/queries/retention.h"
#include "outbox/worker_common.h"

extern "C" {
#include "utils/timestamp.h"
}

namespace {

// This backend's transaction's announcement.
outbox::low_water::Announcement announcement;

}  // namespace

void outbox_writer_wrote(int64 id) { announcement.wrote(id); }

void outbox_writer_done(bool committed) {
    int64 id = announcement.take();
    // The commit's own wake-up follows (wakeup.cpp), so no latch here.
    if (id >= 0 && committed) outbox_relays_lower_rescan(MyDatabaseId, id, false);
}

void outbox_relay_rescan_from(Oid database, int64 id) {
    outbox_relays_lower_rescan(database, id, true);
}

void outbox_low_water_start_turn(outbox::low_water::Mark *mark) {
    mark->lower_to(outbox_relay_take_rescan());
}

void outbox_low_water_end_turn(outbox::low_water::Mark *mark, int schema, bool waiting) {
    // The sequence first, then the statement whose snapshot finds the first
    // pending row: the order the design note's argument rests on.
    int64 next_id = outbox_relay_last_id() + 1;
    int64 first = outbox_relay_first_pending(schema, mark->value(), waiting);
    mark->advance(first, next_id);
    outbox_relay_set_low_water(mark->value());
}

long outbox_straggler_scan(OutboxWorker *w) {
    int64 mark = outbox_relays_lowest_low_water(MyDatabaseId);
    if (mark <= 0 || mark == PG_INT64_MAX) return -1;  // no relay, or it scans from the start
    TimestampTz start = GetCurrentTimestamp();
    if (!outbox_worker_begin(w, "pg outbox: looking for stragglers")) return -1;
    bool waiting = w->schema >= kOutboxSchema13 && outbox_relay_next_retry() != 0;
    int64 straggler = outbox_straggler_below(w->schema, mark, waiting);
    outbox_worker_commit(w);
    if (straggler >= 0) {
        ereport(DEBUG1, (errmsg("%s: message %lld is pending below the relays' mark %lld",
                                w->label, static_cast<long long>(straggler),
                                static_cast<long long>(mark))));
        outbox_relay_rescan_from(MyDatabaseId, straggler);
    }
    long took = TimestampDifferenceMilliseconds(start, GetCurrentTimestamp());
    return outbox::low_water::next_scan_in_ms(static_cast<long>(outbox_poll_interval_ms), took,
                                              outbox::policy::kStragglerCostShare);
}
