// The inbox handler background worker, one per database (outbox.inbox).
//
// Takes unprocessed inbox records of subscribed topics in arrival order
// (received_at, then seq) with FOR UPDATE SKIP LOCKED and, for each, calls
// the topic's handler(msg outbox.inbox_message) as the role that subscribed
// it, then marks the record processed - both inside one subtransaction of
// the batch's transaction, so the handler's writes and the processed flag
// commit together or not at all.
//
// A handler that raises rolls back only its record's subtransaction: the
// record gets one attempt more, the error text, and a retry time (0.5 s
// doubling to 5 min); after outbox.max_attempts failures it is parked
// (outbox.inbox_parked, outbox.inbox_retry()).  Later records of the same
// key wait while an earlier one is being retried, so a key's records are
// handled in order; once it is parked they go on.  Records without a key
// have no order to keep.
//
// Postgres-side code only (handlers are Postgres functions).

#include "outbox/pg.h"

#include "outbox/guc.h"
#include "outbox/outbox_queries.h"
#include "outbox/shmem.h"
#include "outbox/worker_common.h"
#include "outbox/workers.h"

extern "C" {
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/regproc.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"
}

namespace {

constexpr int kMaxHandlerBatch = 100;

MemoryContext loop_context = nullptr;
char label[NAMEDATALEN + 40] = "";
bool woken = false;

struct Subscription {
    char *topic;
    Oid handler;
    Oid run_as;
};

WaitEventSet *wait_set = nullptr;

void wait_ms(long ms) {
    if (outbox_worker_wait(wait_set, -1, ms)) woken = true;
}

bool key_in(const char *key, char **keys, int n) {
    for (int i = 0; i < n; i++)
        if (strcmp(keys[i], key) == 0) return true;
    return false;
}

bool may_execute(Oid handler, Oid role) {
#if PG_VERSION_NUM >= 160000
    return object_aclcheck(ProcedureRelationId, handler, role, ACL_EXECUTE) == ACLCHECK_OK;
#else
    return pg_proc_aclcheck(handler, role, ACL_EXECUTE) == ACLCHECK_OK;
#endif
}

struct HandlerCall {
    const Subscription *sub;
    Datum row;
    Datum event_id;
};

// Calls the handler as its subscriber, then marks the record processed.
void call_handler(void *arg) {
    auto *c = static_cast<HandlerCall *>(arg);
    if (!may_execute(c->sub->handler, c->sub->run_as))
        ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                        errmsg("role %s may not execute handler %s",
                               GetUserNameFromId(c->sub->run_as, false),
                               format_procedure(c->sub->handler))));
    Oid save_userid;
    int save_sec_context;
    GetUserIdAndSecContext(&save_userid, &save_sec_context);
    SetUserIdAndSecContext(c->sub->run_as, save_sec_context | SECURITY_LOCAL_USERID_CHANGE);
    // Not OidFunctionCall1: a void SQL function returns NULL, which that
    // refuses.  The result is ignored.
    FmgrInfo flinfo;
    fmgr_info(c->sub->handler, &flinfo);
    LOCAL_FCINFO(fcinfo, 1);
    InitFunctionCallInfoData(*fcinfo, &flinfo, 1, InvalidOid, nullptr, nullptr);
    fcinfo->args[0].value = c->row;
    fcinfo->args[0].isnull = false;
    (void) FunctionCallInvoke(fcinfo);
    SetUserIdAndSecContext(save_userid, save_sec_context);
    outbox_inbox_done(c->event_id);
}

// Handles one record in a subtransaction: the handler's writes and the
// processed flag, or (on error, *error set) nothing at all.
bool handle_one(const Subscription &sub, Datum row, Datum event_id, char **error) {
    HandlerCall call{&sub, row, event_id};
    return outbox_worker_subtransaction(call_handler, &call, error);
}

// One batch in one transaction.  Returns the records claimed, and in
// *next_retry when the earliest retry is due (0: none).
int handle_batch(TimestampTz *next_retry) {
    *next_retry = 0;
    outbox_worker_begin("pg outbox: handling inbox records");
    int claimed = 0;
    uint64 handled = 0, failed = 0, parked = 0;
    if (outbox_extension_ready() && outbox_inbox_ready()) {
        int nsubs = 0;
        char **topics = nullptr;
        Oid *handlers = nullptr, *run_as = nullptr;
        outbox_inbox_subscriptions(&topics, &handlers, &run_as, &nsubs);
        if (nsubs > 0) {
            int nblocked = 0;
            char **blocked = outbox_inbox_retrying_keys(&nblocked);
            OutboxInboxClaim *rows;
            claimed = outbox_inbox_claim(Min(outbox_batch_size, kMaxHandlerBatch), topics, nsubs,
                                         blocked, nblocked, &rows);
            // Keys that failed in this batch: their later records wait.
            char **failed_keys = static_cast<char **>(palloc(sizeof(char *) * (claimed + 1)));
            int nfailed_keys = 0;
            for (int i = 0; i < claimed; i++) {
                CHECK_FOR_INTERRUPTS();
                OutboxInboxClaim &r = rows[i];
                if (r.key && key_in(r.key, failed_keys, nfailed_keys)) continue;
                Subscription sub{nullptr, InvalidOid, InvalidOid};
                for (int s = 0; s < nsubs; s++)
                    if (strcmp(topics[s], r.topic) == 0) sub = {topics[s], handlers[s], run_as[s]};
                if (!OidIsValid(sub.handler)) continue;  // unsubscribed meanwhile
                char *error = nullptr;
                if (handle_one(sub, r.row, r.event_id, &error)) {
                    handled++;
                    continue;
                }
                failed++;
                if (r.key) failed_keys[nfailed_keys++] = r.key;
                bool now_parked = outbox_inbox_failed(r.event_id, error, outbox_max_attempts);
                if (now_parked) {
                    parked++;
                    ereport(WARNING,
                            (errmsg("%s: parked inbox message %s (topic \"%s\") after %d failed "
                                    "handler calls",
                                    label, DatumGetCString(DirectFunctionCall1(uuid_out, r.event_id)),
                                    r.topic, outbox_max_attempts),
                             errdetail("Last error: %s", error),
                             errhint("See outbox.inbox_parked; outbox.inbox_retry(event_id) puts "
                                     "it back.")));
                }
                outbox_stats_error(error);
            }
        }
        *next_retry = outbox_inbox_next_retry();
    }
    outbox_worker_commit(loop_context);
    if (claimed > 0) outbox_stats_add(handled, failed, parked);
    return claimed;
}

}  // namespace

extern "C" PGDLLEXPORT void outbox_inbox_handler_main(Datum main_arg);

void outbox_inbox_handler_main(Datum main_arg) {
    pqsignal(SIGHUP, SignalHandlerForConfigReload);
    pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
    BackgroundWorkerUnblockSignals();

    int slot = DatumGetInt32(main_arg);
    int database_index = slot - outbox_inbox_handler_slot(0);
    const char *dbname = outbox_database_name(database_index);
    BackgroundWorkerInitializeConnection(dbname, nullptr, 0);
    // Handlers run with the database's default search_path, as they would
    // in a session ("$user", public): they are user code.  The worker's own
    // statements name everything with its schema.
    pgstat_report_appname("pg outbox inbox handler");
    snprintf(label, sizeof label, "pg outbox inbox handler [%s]", dbname);
    outbox_slot_attach(slot, OUTBOX_ROLE_INBOX_HANDLER, 0, MyDatabaseId);
    ereport(LOG, (errmsg("%s started", label)));

    loop_context = AllocSetContextCreate(TopMemoryContext, "pg outbox inbox handler",
                                         ALLOCSET_DEFAULT_SIZES);
    wait_set = outbox_worker_wait_set(-1);
    while (!ShutdownRequestPending) {
        if (ConfigReloadPending) {
            ConfigReloadPending = false;
            ProcessConfigFile(PGC_SIGHUP);
        }
        MemoryContextSwitchTo(loop_context);
        volatile int claimed = 0;
        volatile TimestampTz next_retry = 0;
        woken = false;
        PG_TRY();
        {
            TimestampTz due;
            claimed = handle_batch(&due);
            next_retry = due;
        }
        PG_CATCH();
        {
            outbox_worker_recover(loop_context);
            claimed = 0;
            next_retry = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), 1000);
        }
        PG_END_TRY();
        MemoryContextReset(loop_context);
        if (claimed > 0) continue;  // more may be waiting
        long wait = outbox_poll_interval_ms;
        TimestampTz now = GetCurrentTimestamp();
        if (next_retry > 0)
            wait = Min(wait, Max(10L, TimestampDifferenceMilliseconds(now, next_retry)));
        wait_ms(wait);
    }
    ereport(LOG, (errmsg("%s stopped", label)));
    proc_exit(0);
}
