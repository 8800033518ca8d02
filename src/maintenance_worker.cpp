// The maintenance background worker, one per database: the retention pass.
//
// Every minute (or every outbox.retention / 2 when that is shorter, at least
// every second) it deletes, in transactions of kRetentionBatch rows:
//   - published outbox rows older than outbox.retention,
//   - processed_event rows whose expires_at has passed,
//   - processed inbox rows older than outbox.retention.
// Pending and parked outbox rows are never touched (the seed forbids
// deleting unpublished rows).  Each batch locks only the rows it deletes
// (SKIP LOCKED: a row a relay or replay holds is left for the next pass) and
// rechecks the condition on the locked row.  outbox.retention = 0 keeps
// everything.  A pass stops after kPassBudgetMs and resumes at once; so a
// long backlog of old rows is worked off without ever holding long locks.
//
// Postgres-side code only; errors are caught per pass, logged, and the
// worker goes on after the interval.

#include "outbox/pg.h"

#include "outbox/guc.h"
#include "outbox/outbox_queries.h"
#include "outbox/shmem.h"
#include "outbox/worker_common.h"
#include "outbox/workers.h"

extern "C" {
#include "access/xact.h"
#include "executor/spi.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"
}

namespace {

constexpr int kRetentionBatch = 1000;
constexpr long kPassBudgetMs = 5000;

MemoryContext pass_context = nullptr;

long pass_interval_ms() {
    long half = static_cast<long>(outbox_retention_s) * 1000 / 2;
    return Max(1000L, Min(60000L, half));
}

// Runs one retention batch of `which` in its own transaction; returns the
// number of rows deleted, or -1 when the extension is not installed.
int64 retention_batch(OutboxRetention which, TimestampTz cutoff) {
    outbox_worker_begin("pg outbox: retention");
    int64 deleted = -1;
    if (outbox_extension_ready()) deleted = outbox_retention_delete(which, cutoff, kRetentionBatch);
    outbox_worker_commit(pass_context);
    return deleted;
}

// One pass: each kind in turn until it has nothing old left or the budget
// is spent.  Returns true when it stopped early (more to delete).
bool retention_pass() {
    if (outbox_retention_s <= 0) return false;
    TimestampTz now = GetCurrentTimestamp();
    TimestampTz old = now - static_cast<TimestampTz>(outbox_retention_s) * USECS_PER_SEC;
    TimestampTz deadline = TimestampTzPlusMilliseconds(now, kPassBudgetMs);
    const struct {
        OutboxRetention which;
        TimestampTz cutoff;
    } kinds[] = {{OUTBOX_RETENTION_PUBLISHED, old},
                 {OUTBOX_RETENTION_PROCESSED_EVENTS, now},
                 {OUTBOX_RETENTION_INBOX, old}};
    uint64 deleted = 0;
    bool more = false;
    for (const auto &k : kinds) {
        for (;;) {
            CHECK_FOR_INTERRUPTS();
            int64 n = retention_batch(k.which, k.cutoff);
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

WaitEventSet *wait_set = nullptr;

void wait_ms(long ms) { outbox_worker_wait(wait_set, -1, ms); }

}  // namespace

extern "C" PGDLLEXPORT void outbox_maintenance_main(Datum main_arg);

void outbox_maintenance_main(Datum main_arg) {
    pqsignal(SIGHUP, SignalHandlerForConfigReload);
    pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
    BackgroundWorkerUnblockSignals();

    int slot = DatumGetInt32(main_arg);
    int database_index = slot - outbox_maintenance_slot(0);
    const char *dbname = outbox_database_name(database_index);
    BackgroundWorkerInitializeConnection(dbname, nullptr, 0);
    SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_OVERRIDE);
    // Old rows are found in index order (see the relay for why).
    SetConfigOption("enable_seqscan", "off", PGC_SUSET, PGC_S_OVERRIDE);
    SetConfigOption("enable_bitmapscan", "off", PGC_SUSET, PGC_S_OVERRIDE);
    // A lost delete is redone by the next pass.
    SetConfigOption("synchronous_commit", "off", PGC_SUSET, PGC_S_OVERRIDE);
    pgstat_report_appname("pg outbox maintenance");
    outbox_slot_attach(slot, OUTBOX_ROLE_MAINTENANCE, 0, MyDatabaseId);
    ereport(LOG, (errmsg("pg outbox maintenance [%s] started", dbname)));

    pass_context = AllocSetContextCreate(TopMemoryContext, "pg outbox maintenance",
                                         ALLOCSET_DEFAULT_SIZES);
    wait_set = outbox_worker_wait_set(-1);
    while (!ShutdownRequestPending) {
        if (ConfigReloadPending) {
            ConfigReloadPending = false;
            ProcessConfigFile(PGC_SIGHUP);
        }
        MemoryContextSwitchTo(pass_context);
        volatile bool more = false;  // set inside PG_TRY, read after it
        PG_TRY();
        {
            more = retention_pass();
        }
        PG_CATCH();
        {
            outbox_worker_recover(pass_context);
        }
        PG_END_TRY();
        MemoryContextReset(pass_context);
        wait_ms(more ? 10 : pass_interval_ms());
    }
    ereport(LOG, (errmsg("pg outbox maintenance [%s] stopped", dbname)));
    proc_exit(0);
}
