// The maintenance worker, one per database: retention, and the straggler
// scan for the relays' low-water mark.
//
// Retention, every minute (or every outbox.retention / 2 when that is
// shorter, at least every second), in transactions of kRetentionBatch rows:
//   - published outbox rows older than outbox.retention,
//   - processed_event rows whose expires_at has passed,
//   - processed inbox rows older than outbox.retention.
// Pending and parked outbox rows are never touched.  Each batch locks only
// the rows it deletes (SKIP LOCKED: a row a relay or replay holds is left
// for the next pass), rechecks the condition on the locked row, and starts
// where the previous batch stopped.  outbox.retention = 0 keeps everything.
// A pass stops after kPassBudgetMs and resumes at once, so a long backlog of
// old rows is worked off without ever holding long locks.
//
// The straggler scan (outbox_straggler_scan, outbox/low_water.h) looks for
// rows the relays' low-water mark passed without seeing them; the design is
// docs/architecture.md, "The low-water mark".
//
// Postgres-side code only; an ERROR ends the process and the postmaster
// starts it again (worker_common.h).

#include "outbox/guc.h"
#include "outbox/low_water.h"
#include "outbox/queries/retention.h"
#include "outbox/policy.h"
#include "outbox/shmem.h"
#include "outbox/worker_common.h"
#include "outbox/workers.h"

extern "C" {
#include "postmaster/interrupt.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
}

namespace {

using outbox::policy::kPassBudgetMs;
using outbox::policy::kRetentionBatch;

struct MaintenanceState {
    TimestampTz next_pass_at;
    TimestampTz next_straggler_scan_at;
};

MaintenanceState *state(OutboxWorker *w) { return static_cast<MaintenanceState *>(w->state); }

long pass_interval_ms() {
    long half = static_cast<long>(outbox_retention_s) * 1000 / 2;
    return Max(1000L, Min(60000L, half));
}

// Runs one retention batch of `which` in its own transaction; returns the
// number of rows deleted, or -1 when the extension is not ready here.
int64 retention_batch(OutboxWorker *w, OutboxRetention which, TimestampTz cutoff, int64 *from) {
    if (!outbox_worker_begin(w, "pg outbox: retention")) return -1;
    int64 deleted = outbox_retention_delete(which, cutoff, kRetentionBatch, from);
    outbox_worker_commit(w);
    return deleted;
}

// One pass: each kind in turn until it has nothing old left or the budget
// is spent.  Returns true when it stopped early (more to delete).
bool retention_pass(OutboxWorker *w) {
    if (outbox_retention_s <= 0) return false;
    TimestampTz now = GetCurrentTimestamp();
    TimestampTz old = now - static_cast<TimestampTz>(outbox_retention_s) * USECS_PER_SEC;
    TimestampTz deadline = TimestampTzPlusMilliseconds(now, kPassBudgetMs);
    const struct {
        OutboxRetention which;
        TimestampTz cutoff;
        int64 from;
    } kinds[] = {{OUTBOX_RETENTION_PUBLISHED, old, 0},
                 {OUTBOX_RETENTION_PROCESSED_EVENTS, now, DT_NOBEGIN},
                 {OUTBOX_RETENTION_INBOX, old, DT_NOBEGIN}};
    uint64 deleted = 0;
    bool more = false;
    for (const auto &k : kinds) {
        int64 from = k.from;
        for (;;) {
            CHECK_FOR_INTERRUPTS();
            int64 n = retention_batch(w, k.which, k.cutoff, &from);
            if (n < 0) return false;  // no extension here (yet)
            deleted += static_cast<uint64>(n);
            if (n < kRetentionBatch) break;
            if (GetCurrentTimestamp() >= deadline || ShutdownRequestPending) {
                more = true;
                break;
            }
        }
    }
    outbox_stats_add(deleted, 0, 0);
    return more;
}

void straggler_scan(OutboxWorker *w) {
    long next_in_ms = outbox_straggler_scan(w);
    // No mark to compare with yet (no relay, or one that has not claimed):
    // look again within a second, not at once (that was a thousand wake-ups
    // a second while outbox.brokers was empty).
    if (next_in_ms < 0) next_in_ms = Min(outbox_poll_interval_ms, 1000);
    state(w)->next_straggler_scan_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), next_in_ms);
}

void maintenance_start(OutboxWorker *w) {
    w->state = MemoryContextAllocZero(TopMemoryContext, sizeof(MaintenanceState));
    // A lost delete is redone by the next pass.
    SetConfigOption("synchronous_commit", "off", PGC_SUSET, PGC_S_SESSION);
}

long maintenance_turn(OutboxWorker *w) {
    MaintenanceState *s = state(w);
    TimestampTz now = GetCurrentTimestamp();
    if (now >= s->next_straggler_scan_at) straggler_scan(w);
    if (now >= s->next_pass_at) {
        bool more = retention_pass(w);
        s->next_pass_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
                                                      more ? 10 : pass_interval_ms());
    }
    now = GetCurrentTimestamp();
    TimestampTz next = Min(s->next_pass_at, s->next_straggler_scan_at);
    return Max(1L, TimestampDifferenceMilliseconds(now, next));
}

// A changed outbox.retention applies at once.
void maintenance_reload(OutboxWorker *w) { state(w)->next_pass_at = 0; }

const OutboxWorkerKind kMaintenance = {
    OUTBOX_ROLE_MAINTENANCE,
    OutboxOnSigterm::kFinishTurn,
    OutboxKafka::kNone,
    OutboxPlanner::kIndexOrder,  // old rows are found in index order, as the relay claims
    kOutboxSchema10,
    maintenance_start,
    maintenance_turn,
    maintenance_reload,
    nullptr,
};

}  // namespace

void outbox_maintenance_main(Datum main_arg) { outbox_worker_main(&kMaintenance, main_arg); }
