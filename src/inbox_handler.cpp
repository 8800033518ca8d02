// The inbox handlers: outbox.inbox_workers per database (outbox.inbox), each
// owning a share of the record keys, so a key's records are handled by one
// worker, in order.
//
// Each turn goes round the subscribed topics, one transaction per topic,
// starting one further each turn: a topic gets a slice of kTopicSliceMs,
// then the next topic has its turn, so a slow handler never holds the other
// topics up for longer than that.  Within a topic, records go in arrival
// order (received_at, then seq), claimed FOR UPDATE SKIP LOCKED:
//   - a handler of one record, handler(msg outbox.inbox_message), is called
//     for each, and the record is marked processed in the same
//     subtransaction: its writes and the flag commit together or not at all;
//   - a set-based handler, handler(msgs outbox.inbox_message[]), gets the
//     whole batch in one call (its size follows how long the handler takes
//     per record, so the call fits the slice), all marked in the same
//     subtransaction; when the call raises, the batch is handled again one
//     record at a time, each in its own subtransaction, so that one bad
//     record is parked with its own error and the rest are handled.
//
// Handlers run as the role that owns the function, never more, under
// SECURITY_RESTRICTED_OPERATION (no SET ROLE, no temporary objects) and a
// GUC nest level of their own, with the settings a session of that role in
// this database starts with (the database's, then the role's ALTER ROLE
// ... SET), and exit_on_error off: nothing a handler sets or creates
// outlives its call.
// A subscription whose owner may no longer have that role's handler run
// (see inbox_api.cpp) is skipped, and said so once.
//
// A handler that raises rolls back only its record's subtransaction: the
// record gets one attempt more, the error text, and a retry time (policy.h);
// after outbox.max_attempts failures it is parked (outbox.inbox_parked,
// outbox.inbox_retry()).  Later records of the same key wait while an
// earlier one is being retried, so a key's records are handled in order;
// once it is parked they go on.  Records without a key have no order to keep.
//
// A call past outbox.inbox_handler_timeout is cancelled (an ERROR: a failed
// attempt).  A call that catches its cancellation and goes on is ended with
// the worker's process kHandlerCancelGraceMs later; so is one that raises a
// FATAL.  Shared memory keeps the call's records across the restart, and
// the next process counts the call as their failed attempt (shmem.h): a
// handler can neither hold its worker for ever nor have its record called
// again for ever.
//
// SIGTERM cancels a handler like a backend's statement (worker_common.h).
// Postgres-side code only (handlers are Postgres functions).

#include "outbox/guc.h"
#include "outbox/queries/inbox.h"
#include "outbox/shmem.h"
#include "outbox/policy.h"
#include "outbox/worker_common.h"
#include "outbox/workers.h"

extern "C" {
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/indexing.h"
#include "catalog/namespace.h"
#include "catalog/pg_db_role_setting.h"
#include "catalog/pg_proc.h"
#include "utils/elog.h"
#include "utils/fmgroids.h"
#include "executor/spi.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/regproc.h"
#include "utils/timestamp.h"
#include "utils/timeout.h"
}

namespace {

using outbox::policy::kHandlerBatchBytes;
using outbox::policy::kHandlerCancelGraceMs;
using outbox::policy::kMaxHandlerBatch;
using outbox::policy::kTopicSliceMs;
constexpr int kMaxTopics = 256;  // topics whose pace is remembered

// The worker's own statements (claims, marks) read a topic through its
// index, in order; each handler call gets its database's planner values back.
constexpr OutboxPlanner kHandlerPlanner = OutboxPlanner::kIndexOrderNoSort;

struct TopicPace {
    Oid handler;
    double ms_per_record;  // moving average of the handler's time per record
    bool said_skipped;
};

struct HandlerState {
    int next_topic;  // where the next turn starts
    int npace;
    TopicPace pace[kMaxTopics];
};

HandlerState *state(OutboxWorker *w) { return static_cast<HandlerState *>(w->state); }

TopicPace *pace_of(HandlerState *s, Oid handler) {
    for (int i = 0; i < s->npace; i++)
        if (s->pace[i].handler == handler) return &s->pace[i];
    if (s->npace == kMaxTopics) s->npace = 0;  // forget the oldest: only a pace
    TopicPace *p = &s->pace[s->npace++];
    *p = TopicPace{handler, 1.0, false};
    return p;
}

bool key_in(const char *key, char **keys, int n) {
    for (int i = 0; i < n; i++)
        if (strcmp(keys[i], key) == 0) return true;
    return false;
}

bool may_execute(Oid handler, Oid role) { return outbox::pg::may_execute_function(handler, role); }

// The timeout that ends a call which ignored its cancellation, and the
// log hook that notes why a call ends the process.
TimeoutId end_call_timeout;
emit_log_hook_type prev_emit_log_hook = nullptr;

// In a signal handler: only flags, as Postgres' own die() sets them.
void end_ignored_call() {
    outbox_call_note_end("the handler ran past outbox.inbox_handler_timeout and ignored its "
                         "cancellation: its worker was ended",
                         true);
    InterruptPending = true;
    ProcDiePending = true;
    SetLatch(MyLatch);
}

void note_fatal(ErrorData *edata) {
    // A stop asked for (SIGTERM: a DBA, a shutdown) is not the call's fault.
    if (edata->elevel >= FATAL && edata->sqlerrcode == ERRCODE_ADMIN_SHUTDOWN)
        outbox_call_forget_unless_timed_out();
    else if (edata->elevel >= FATAL && edata->message)
        outbox_call_note_end(edata->message, false);
    if (prev_emit_log_hook) prev_emit_log_hook(edata);
}

// The settings of one pg_db_role_setting row (`database`, `role`), as a
// session's SET would make them, in the current GUC nest level.  One a
// session of the role could not have either (a bad value, a setting a
// security-restricted operation refuses) is skipped, as at login.
void apply_setting_row(Relation rel, Oid database, Oid role) {
    ScanKeyData keys[2];
    ScanKeyInit(&keys[0], Anum_pg_db_role_setting_setdatabase, BTEqualStrategyNumber, F_OIDEQ,
                ObjectIdGetDatum(database));
    ScanKeyInit(&keys[1], Anum_pg_db_role_setting_setrole, BTEqualStrategyNumber, F_OIDEQ,
                ObjectIdGetDatum(role));
    SysScanDesc scan = systable_beginscan(rel, DbRoleSettingDatidRolidIndexId, true, nullptr, 2, keys);
    HeapTuple tuple;
    while (HeapTupleIsValid(tuple = systable_getnext(scan))) {
        bool isnull;
        Datum d = heap_getattr(tuple, Anum_pg_db_role_setting_setconfig, RelationGetDescr(rel),
                               &isnull);
        if (isnull) continue;
        Datum *items;
        bool *nulls;
        int n;
        deconstruct_array(DatumGetArrayTypeP(d), TEXTOID, -1, false, TYPALIGN_INT, &items, &nulls,
                          &n);
        for (int i = 0; i < n; i++) {
            if (nulls[i]) continue;
            char *name, *value;
            ParseLongOption(TextDatumGetCString(items[i]), &name, &value);
            if (value)
                (void) set_config_option(name, value, PGC_SUSET, PGC_S_SESSION, GUC_ACTION_SAVE,
                                         true, DEBUG1, false);
        }
    }
    systable_endscan(scan);
}

// What ALTER ROLE `role` [IN DATABASE this one] SET gives a session of it.
void apply_role_settings(Oid role) {
    Relation rel = table_open(DbRoleSettingRelationId, AccessShareLock);
    apply_setting_row(rel, InvalidOid, role);
    apply_setting_row(rel, MyDatabaseId, role);
    table_close(rel, AccessShareLock);
}

struct HandlerCall {
    const OutboxSubscription *sub;
    Datum arg;               // one row, or an array of rows
    const Datum *event_ids;  // marked processed when the call returns
    int n;
};

// Calls the handler as its owner, in a security-restricted operation with a
// GUC nest level of its own, then marks its records processed.  Inside the
// caller's subtransaction: an ERROR there undoes all of it.
void call_handler(void *arg) {
    auto *c = static_cast<HandlerCall *>(arg);
    if (!may_execute(c->sub->handler, c->sub->owner))
        ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                        errmsg("role %s may not execute handler %s",
                               GetUserNameFromId(c->sub->owner, false),
                               format_procedure(c->sub->handler))));
    Oid save_userid;
    int save_sec_context;
    GetUserIdAndSecContext(&save_userid, &save_sec_context);
    int nest = NewGUCNestLevel();
    (void) set_config_option("search_path", outbox_worker_user_search_path(), PGC_USERSET,
                             PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
    // The handler plans with what a session of its database gets, not with
    // the worker's own planner pins (the kind's, outbox_planner_off).
    for (const char *const *name = outbox_planner_off(kHandlerPlanner); *name; name++)
        (void) set_config_option(*name, GetConfigOptionResetString(*name), PGC_USERSET,
                                 PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
    SetUserIdAndSecContext(c->sub->owner, save_sec_context | SECURITY_LOCAL_USERID_CHANGE |
                                              SECURITY_RESTRICTED_OPERATION);
    apply_role_settings(c->sub->owner);
    // An error the worker means to catch must stay an ERROR, whatever the
    // database or the role says (the handler may still turn it on itself:
    // its FATAL then counts as a failed attempt, see above).
    (void) set_config_option("exit_on_error", "off", PGC_SUSET, PGC_S_SESSION, GUC_ACTION_SAVE,
                             true, 0, false);
    // Postgres' own statement timeout, armed by hand (a worker runs no
    // top-level statements): a call past it ends with an ERROR, which undoes
    // the subtransaction and counts as a failed attempt.  A call that
    // catches that ERROR is ended with the process a little later.
    if (outbox_inbox_handler_timeout_ms > 0) {
        enable_timeout_after(STATEMENT_TIMEOUT, outbox_inbox_handler_timeout_ms);
        enable_timeout_after(end_call_timeout,
                             outbox_inbox_handler_timeout_ms + static_cast<int>(kHandlerCancelGraceMs));
    }
    // Not OidFunctionCall1: a void SQL function returns NULL, which that
    // refuses.  The result is ignored.
    FmgrInfo flinfo;
    fmgr_info(c->sub->handler, &flinfo);
    LOCAL_FCINFO(fcinfo, 1);
    InitFunctionCallInfoData(*fcinfo, &flinfo, 1, InvalidOid, nullptr, nullptr);
    fcinfo->args[0].value = c->arg;
    fcinfo->args[0].isnull = false;
    (void) FunctionCallInvoke(fcinfo);
    disable_timeout(STATEMENT_TIMEOUT, false);
    disable_timeout(end_call_timeout, false);
    // Whatever the handler set, SET LOCAL or not, goes with its nest level.
    AtEOXact_GUC(false, nest);
    SetUserIdAndSecContext(save_userid, save_sec_context);
    outbox_inbox_done(c->sub->topic, c->event_ids, c->n);
}

// call_handler in a subtransaction; false with the error when it raised.
// The handler's timeout never outlives the call, whichever way it ended.
bool run_handler(HandlerCall *call, char **error, int *sqlerrcode) {
    outbox_call_begin(call->sub->topic, call->event_ids, call->n);
    bool ok = outbox_worker_subtransaction(call_handler, call, error, sqlerrcode);
    outbox_call_end();
    if (get_timeout_active(end_call_timeout)) disable_timeout(end_call_timeout, false);
    if (get_timeout_active(STATEMENT_TIMEOUT)) disable_timeout(STATEMENT_TIMEOUT, false);
    if (get_timeout_indicator(STATEMENT_TIMEOUT, true)) QueryCancelPending = false;
    return ok;
}

Datum rows_array(const OutboxInboxClaim *rows, int n) {
    Datum *elems = static_cast<Datum *>(palloc(sizeof(Datum) * n));
    for (int i = 0; i < n; i++) elems[i] = rows[i].row;
    Oid type = get_rel_type_id(get_relname_relid("inbox_message", get_namespace_oid("outbox", false)));
    return PointerGetDatum(construct_array(elems, n, type, -1, false, TYPALIGN_DOUBLE));
}

struct TopicCounts {
    uint64 handled = 0, failed = 0, parked = 0;
};

// A handler's error text is the user's and may quote the record (RAISE
// ... %, a constraint's "Key (card)=(...)"): it is kept in the record's
// row, which only the record's readers may select.  The log and
// outbox.worker_stats (pg_monitor, every database) name the handler, the
// SQLSTATE and the topic instead.
void record_failure(OutboxWorker *w, const OutboxInboxClaim &r, const OutboxSubscription &sub,
                    const char *error, int sqlerrcode, TopicCounts *counts) {
    counts->failed++;
    const char *handler = format_procedure(sub.handler);
    const char *code = unpack_sql_state(sqlerrcode);
    if (outbox_inbox_failed(sub.topic, r.event_id, error, outbox_max_attempts)) {
        counts->parked++;
        ereport(WARNING,
                (errmsg("%s: parked inbox message %s (topic \"%s\") after %d failed handler calls",
                        w->label, DatumGetCString(DirectFunctionCall1(uuid_out, r.event_id)),
                        sub.topic, outbox_max_attempts),
                 errdetail("The last call of %s failed with SQLSTATE %s.", handler, code),
                 errhint("outbox.inbox_parked has its error text; outbox.inbox_retry(event_id, topic) "
                         "puts it back.")));
    }
    char text[512];
    snprintf(text, sizeof text,
             "handler %s failed with SQLSTATE %s on a record of topic \"%s\" (its error text "
             "is in outbox.inbox_message.last_error)",
             handler, code, sub.topic);
    outbox_stats_error(text);
}

// Handles records one at a time, each in its own subtransaction; a key
// whose record failed has its later records wait.  Stops when the slice is
// spent (the rest stay unprocessed).
void handle_one_by_one(OutboxWorker *w, const OutboxSubscription &sub, OutboxInboxClaim *rows,
                       int n, TimestampTz deadline, TopicCounts *counts) {
    char **failed_keys = static_cast<char **>(palloc(sizeof(char *) * (n + 1)));
    int nfailed = 0;
    for (int i = 0; i < n; i++) {
        CHECK_FOR_INTERRUPTS();
        if (i > 0 && GetCurrentTimestamp() >= deadline) break;
        OutboxInboxClaim &r = rows[i];
        if (r.key && key_in(r.key, failed_keys, nfailed)) continue;
        HandlerCall call{&sub, sub.batch ? rows_array(&r, 1) : r.row, &r.event_id, 1};
        char *error = nullptr;
        int sqlerrcode = 0;
        if (run_handler(&call, &error, &sqlerrcode)) {
            counts->handled++;
            continue;
        }
        if (r.key) failed_keys[nfailed++] = r.key;
        record_failure(w, r, sub, error, sqlerrcode, counts);
    }
}

// One topic's batch in one transaction; returns the records claimed.
int handle_topic(OutboxWorker *w, const OutboxSubscription &sub) {
    HandlerState *s = state(w);
    TopicPace *pace = pace_of(s, sub.handler);
    // A set-based handler gets as many records as fit its slice.
    int limit = Min(outbox_batch_size, kMaxHandlerBatch);
    if (sub.batch)
        limit = Max(1, Min(limit, static_cast<int>(kTopicSliceMs / Max(pace->ms_per_record, 0.001))));
    if (!outbox_worker_begin(w, "pg outbox: handling inbox records")) return 0;
    TimestampTz start = GetCurrentTimestamp();
    TimestampTz deadline = TimestampTzPlusMilliseconds(start, kTopicSliceMs);
    int nblocked = 0;
    char **blocked = outbox_inbox_retrying_keys(sub.topic, &nblocked);
    OutboxInboxClaim *rows;
    int claimed = outbox_inbox_claim(sub.topic, limit, w->share, blocked, nblocked,
                                     kHandlerBatchBytes, &rows);
    TopicCounts counts;
    if (claimed > 0 && sub.batch) {
        Datum *ids = static_cast<Datum *>(palloc(sizeof(Datum) * claimed));
        for (int i = 0; i < claimed; i++) ids[i] = rows[i].event_id;
        HandlerCall call{&sub, rows_array(rows, claimed), ids, claimed};
        char *error = nullptr;
        int sqlerrcode = 0;
        if (run_handler(&call, &error, &sqlerrcode)) {
            counts.handled = static_cast<uint64>(claimed);
        } else {
            ereport(DEBUG1, (errmsg("%s: a batch of %d records of \"%s\" failed (SQLSTATE %s); "
                                    "handling them one by one",
                                    w->label, claimed, sub.topic, unpack_sql_state(sqlerrcode))));
            handle_one_by_one(w, sub, rows, claimed, TimestampTzPlusMilliseconds(deadline, kTopicSliceMs),
                              &counts);
        }
    } else if (claimed > 0) {
        handle_one_by_one(w, sub, rows, claimed, deadline, &counts);
    }
    outbox_worker_commit(w);
    uint64 done = counts.handled + counts.failed;
    if (done > 0) {
        double ms = static_cast<double>(
                        TimestampDifferenceMilliseconds(start, GetCurrentTimestamp())) /
                    static_cast<double>(done);
        pace->ms_per_record = 0.7 * pace->ms_per_record + 0.3 * ms;
        outbox_stats_add(counts.handled, counts.failed, counts.parked);
    }
    return claimed;
}

// Reads the subscriptions (and when the next retry is due) in a short
// transaction; copies them into the turn's memory.
int read_subscriptions(OutboxWorker *w, OutboxSubscription **subs, TimestampTz *next_retry) {
    if (!outbox_worker_begin(w, "pg outbox: reading inbox subscriptions")) return -1;
    OutboxSubscription *found;
    int n = outbox_inbox_subscriptions(w->schema, &found);
    *next_retry = outbox_inbox_next_retry();
    MemoryContext spi = MemoryContextSwitchTo(w->turn_context);
    *subs = static_cast<OutboxSubscription *>(palloc(sizeof(OutboxSubscription) * (n + 1)));
    for (int i = 0; i < n; i++) {
        (*subs)[i] = found[i];
        (*subs)[i].topic = pstrdup(found[i].topic);
        (*subs)[i].handler_name = found[i].handler_name ? pstrdup(found[i].handler_name) : nullptr;
    }
    MemoryContextSwitchTo(spi);
    outbox_worker_commit(w);
    return n;
}

// A call that ended this worker's previous process: counted as a failed
// attempt of each of its records (parked after outbox.max_attempts).
void charge_unfinished_call(OutboxWorker *w) {
    pg_uuid_t *ids;
    char *topic = nullptr;
    char why[256];
    bool timed_out;
    if (!outbox_worker_begin(w, "pg outbox: counting an unfinished handler call")) return;
    int n = outbox_call_take_unfinished(&topic, &ids, why, sizeof why, &timed_out);
    if (n == 0) {
        outbox_worker_commit(w);
        return;
    }
    const char *error = timed_out || why[0] == '\0'
                            ? (why[0] ? why : "the handler call ended its worker's process")
                            : psprintf("the handler call ended its worker's process: %s", why);
    int parked = 0;
    for (int i = 0; i < n; i++)
        if (outbox_inbox_failed(topic, UUIDPGetDatum(&ids[i]), error, outbox_max_attempts))
            parked++;
    outbox_worker_commit(w);
    outbox_stats_add(0, static_cast<uint64>(n), static_cast<uint64>(parked));
    ereport(WARNING, (errmsg("%s: a handler call ended this worker's previous process; counted "
                             "as a failed attempt of its %d record(s), %d parked",
                             w->label, n, parked),
                      errdetail("%s", timed_out ? "It ran past outbox.inbox_handler_timeout and "
                                                  "ignored its cancellation."
                                                : "It raised a FATAL error."),
                      errhint("outbox.inbox_message.last_error has the reason.")));
}

void handler_start(OutboxWorker *w) {
    w->state = MemoryContextAllocZero(TopMemoryContext, sizeof(HandlerState));
    end_call_timeout = RegisterTimeout(USER_TIMEOUT, end_ignored_call);
    prev_emit_log_hook = emit_log_hook;
    emit_log_hook = note_fatal;
    charge_unfinished_call(w);
}

long handler_turn(OutboxWorker *w) {
    HandlerState *s = state(w);
    OutboxSubscription *subs;
    TimestampTz next_retry = 0;
    w->woken = false;
    int n = read_subscriptions(w, &subs, &next_retry);
    if (n < 0) return outbox_poll_interval_ms;
    bool busy = false;
    for (int k = 0; k < n; k++) {
        const OutboxSubscription &sub = subs[(s->next_topic + k) % n];
        TopicPace *pace = pace_of(s, sub.handler);
        if (!sub.exists || !sub.allowed) {
            if (pace->said_skipped) continue;
            if (sub.exists && !sub.subscriber_exists)
                ereport(WARNING,
                        (errmsg("%s: the records of topic \"%s\" wait: the role that subscribed "
                                "it (OID %u) no longer exists, and its handler %s is not run for it",
                                w->label, sub.topic, sub.subscriber,
                                sub.handler_name ? sub.handler_name : "?"),
                         errhint("A superuser may subscribe the topic again with "
                                 "outbox.inbox_subscribe(); no other role can act for a dropped "
                                 "one.")));
            else
                ereport(WARNING,
                        (errmsg("%s: the records of topic \"%s\" wait: %s %s", w->label,
                                sub.topic,
                                !sub.exists ? "its handler function no longer exists:"
                                            : "the role that subscribed it may no longer have "
                                              "this handler run (its owner's privileges, or the "
                                              "function now under that signature belongs to "
                                              "another role than when it was subscribed):",
                                sub.handler_name ? sub.handler_name : "?"),
                         errhint("A handler is found by its schema, name and argument types: "
                                 "one dropped, renamed or moved since it was subscribed is not. "
                                 "Subscribe the topic again with outbox.inbox_subscribe().")));
            pace->said_skipped = true;
            continue;
        }
        pace->said_skipped = false;
        if (handle_topic(w, sub) > 0) busy = true;
        CHECK_FOR_INTERRUPTS();
    }
    s->next_topic = n > 0 ? (s->next_topic + 1) % n : 0;
    if (busy || w->woken) return 0;  // more may be waiting
    long wait = outbox_poll_interval_ms;
    if (next_retry > 0)
        wait = Min(wait, Max(10L, TimestampDifferenceMilliseconds(GetCurrentTimestamp(), next_retry)));
    return wait;
}

const OutboxWorkerKind kHandler = {
    OUTBOX_ROLE_INBOX_HANDLER,
    OutboxOnSigterm::kCancelTurn,
    OutboxKafka::kNone,
    kHandlerPlanner,
    kOutboxSchema14,
    handler_start,
    handler_turn,
    nullptr,
    nullptr,
};

}  // namespace

void outbox_inbox_handler_main(Datum main_arg) { outbox_worker_main(&kHandler, main_arg); }
