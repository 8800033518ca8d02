#include "outbox/worker_common.h"

#include <fcntl.h>
#include <unistd.h>

#include "outbox/guc.h"
#include "outbox/workers.h"

extern "C" {
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_namespace.h"
#include "executor/spi.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/syscache.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"
}

namespace {

char *user_search_path = nullptr;

// The session settings every worker's own statements run with, set as a
// session's SET would (so they win over ALTER DATABASE / ALTER ROLE ...
// SET): nothing a database owner configures may redirect a name, make a
// claim fail or wait, or turn the relay's transactions into something else.
const struct {
    const char *name;
    const char *value;
} kPinned[] = {
    // Every name our statements use is schema-qualified or in pg_catalog;
    // pg_catalog first means an operator or function of another schema can
    // never be chosen (CVE-2018-1058).  pg_temp is never searched for
    // functions or operators.
    {"search_path", "pg_catalog, pg_temp"},
    // An ERROR a worker catches (a refused record, a failed handler) must
    // not become a FATAL that restarts it into the same record for ever.
    {"exit_on_error", "off"},
    {"statement_timeout", "0"},
    {"lock_timeout", "0"},
    {"idle_in_transaction_session_timeout", "0"},
    {"default_transaction_isolation", "read committed"},
    {"default_transaction_read_only", "off"},
    {"default_transaction_deferrable", "off"},
    {"session_replication_role", "origin"},
    {"row_security", "on"},
    {"plan_cache_mode", "auto"},
    {"max_parallel_workers_per_gather", "0"},
    // A JIT compilation in a claim would cost more than the claim.
    {"jit", "off"},
    // The plans sql/plans.sql pins need these; a database default
    // (ALTER DATABASE ... SET enable_indexscan = off) must not turn every
    // claim into a scan of the whole table.
    {"enable_indexscan", "on"},
    {"enable_indexonlyscan", "on"},
    {"enable_tidscan", "on"},
    {"enable_sort", "on"},
    {"enable_nestloop", "on"},
    {"enable_hashjoin", "on"},
    {"enable_mergejoin", "on"},
    {"enable_hashagg", "on"},
    // The inbox consumer hands arrays (header_names, header_values) to
    // Postgres as array literals whose absent values are written NULL:
    // with array_nulls = off, a header without a value would be stored as
    // the four bytes "NULL".
    {"array_nulls", "on"},
    // What a literal or "= NULL" means must not depend on the database.
    {"standard_conforming_strings", "on"},
    {"transform_null_equals", "off"},
    {"bytea_output", "hex"},
    // A database owner may ALTER DATABASE ... SET role (or
    // session_authorization, below) to itself: the workers would run as
    // that role, fail on the extension's tables (the inbox consumer for
    // ever, the relay without a word) or run user code with its rights.
    // A worker is always the bootstrap superuser it connected as.
    {"role", "none"},
};

const char *const kIndexOrderOff[] = {"enable_seqscan", "enable_bitmapscan", nullptr};
const char *const kIndexOrderNoSortOff[] = {"enable_seqscan", "enable_bitmapscan", "enable_sort",
                                            "enable_incremental_sort", nullptr};
const char *const kNothingOff[] = {nullptr};

void pin_session_settings(OutboxPlanner planner) {
    // session_authorization names a role, so it needs a catalog lookup and
    // with it a transaction; the database's value was applied the same way.
    StartTransactionCommand();
    SetConfigOption("session_authorization", GetUserNameFromId(BOOTSTRAP_SUPERUSERID, false),
                    PGC_SUSET, PGC_S_SESSION);
    CommitTransactionCommand();
    for (const auto &p : kPinned)
        SetConfigOption(p.name, p.value, PGC_SUSET, PGC_S_SESSION);
    for (const auto &p : outbox::pg::kVersionPinned)
        if (p[0]) SetConfigOption(p[0], p[1], PGC_SUSET, PGC_S_SESSION);
    // After kPinned: a kind's planner pins may turn off what kPinned turns on.
    for (const char *const *name = outbox_planner_off(planner); *name; name++)
        SetConfigOption(*name, "off", PGC_SUSET, PGC_S_SESSION);
}

// outbox.wal_compression, for this worker's own session only; at start
// and after each reload ("server": the server's wal_compression again).
void apply_wal_compression() {
    SetConfigOption("wal_compression", outbox_wal_compression_value(), PGC_SUSET, PGC_S_SESSION);
}

int parse_version(const char *v) {
    int major = 0, minor = 0;
    if (sscanf(v, "%d.%d", &major, &minor) < 1) return 0;
    return major * 100 + minor * 10;
}

void say_schema(OutboxWorker *w) {
    int need = w->kind->needs_schema;
    int state = w->schema == 0 ? 0 : w->schema < need ? 1 : 2;
    if (state == w->said_schema) return;
    if (state == 0)
        ereport(LOG, (errmsg("%s: waiting for CREATE EXTENSION outbox in database \"%s\"",
                             w->label, w->dbname)));
    else if (state == 1)
        ereport(LOG,
                (errmsg("%s: waiting for ALTER EXTENSION outbox UPDATE in database \"%s\"",
                        w->label, w->dbname),
                 errdetail("The extension's objects here are version %d.%d; this worker needs "
                           "%d.%d.",
                           w->schema / 100, w->schema % 100 / 10, need / 100, need % 100 / 10)));
    else if (w->said_schema >= 0)
        ereport(LOG, (errmsg("%s: the extension is ready in database \"%s\"", w->label,
                             w->dbname)));
    w->said_schema = state;
}

// Every statement of a worker names the extension's objects by the schema
// "outbox", as the bootstrap superuser: while that name does not resolve to
// a schema only superusers control, the worker serves nothing here (a
// database owner could otherwise have it run the owner's triggers or
// operators).  Says so once per change.
bool say_unsafe(OutboxWorker *w, const char *why) {
    if (!why) {
        if (w->said_unsafe.said_something())
            ereport(LOG, (errmsg("%s: schema \"outbox\" is safe again in database \"%s\"; "
                                 "serving it",
                                 w->label, w->dbname)));
        w->said_unsafe.forget();
        return true;
    }
    if (w->said_unsafe.first_time(why)) {
        ereport(WARNING,
                (errmsg("%s: not serving database \"%s\": schema \"outbox\" %s", w->label,
                        w->dbname, why),
                 errhint("Have a superuser own the extension's schema (ALTER SCHEMA ... OWNER TO) "
                         "once you have checked what it holds, and name it \"outbox\" again; "
                         "see the README, Security.")));
    }
    return false;
}

}  // namespace

namespace {

// Reads the extension's row of pg_extension: its version, owner and schema.
void read_extension(int *version, Oid *owner, Oid *schema = nullptr) {
    *version = 0;
    *owner = InvalidOid;
    if (schema) *schema = InvalidOid;
    Relation rel = table_open(ExtensionRelationId, AccessShareLock);
    ScanKeyData key;
    ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber, F_NAMEEQ,
                CStringGetDatum("outbox"));
    SysScanDesc scan = systable_beginscan(rel, ExtensionNameIndexId, true, nullptr, 1, &key);
    HeapTuple tuple = systable_getnext(scan);
    if (HeapTupleIsValid(tuple)) {
        auto *ext = reinterpret_cast<Form_pg_extension>(GETSTRUCT(tuple));
        *owner = ext->extowner;
        if (schema) *schema = ext->extnamespace;
        bool isnull;
        Datum d = heap_getattr(tuple, Anum_pg_extension_extversion, RelationGetDescr(rel), &isnull);
        if (!isnull) *version = parse_version(TextDatumGetCString(d));
    }
    systable_endscan(scan);
    table_close(rel, AccessShareLock);
}

}  // namespace

const char *const *outbox_planner_off(OutboxPlanner planner) {
    switch (planner) {
        case OutboxPlanner::kCommon: return kNothingOff;
        case OutboxPlanner::kIndexOrder: return kIndexOrderOff;
        case OutboxPlanner::kIndexOrderNoSort: return kIndexOrderNoSortOff;
    }
    return kNothingOff;
}

int outbox_schema_version(void) {
    int version;
    Oid owner;
    read_extension(&version, &owner);
    return version;
}

Oid outbox_extension_owner(void) {
    int version;
    Oid owner;
    read_extension(&version, &owner);
    return owner;
}

char *outbox_keep_string(char *old, const char *value) {
    if (old) pfree(old);
    return MemoryContextStrdup(TopMemoryContext, value ? value : "");
}

const char *outbox_worker_user_search_path(void) {
    return user_search_path ? user_search_path : "\"$user\", public";
}

const char *outbox_schema_unsafe(Oid extension_schema) {
    Oid named = get_namespace_oid("outbox", true);
    HeapTuple tuple = SearchSysCache1(NAMESPACEOID, ObjectIdGetDatum(extension_schema));
    if (!HeapTupleIsValid(tuple)) return "does not exist";
    Oid owner = reinterpret_cast<Form_pg_namespace>(GETSTRUCT(tuple))->nspowner;
    ReleaseSysCache(tuple);
    if (!superuser_arg(owner))
        return psprintf("is owned by role \"%s\", which is not a superuser",
                        GetUserNameFromId(owner, true));
    if (named != extension_schema)
        return "is not the extension's schema (the extension's was renamed, and another took "
               "its name)";
    return nullptr;
}

bool outbox_worker_begin(OutboxWorker *w, const char *activity) {
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    SPI_connect();
    PushActiveSnapshot(GetTransactionSnapshot());
    pgstat_report_activity(STATE_RUNNING, activity);
    Oid owner, schema;
    read_extension(&w->schema, &owner, &schema);
    say_schema(w);
    if (w->schema >= w->kind->needs_schema && say_unsafe(w, outbox_schema_unsafe(schema)))
        return true;
    outbox_worker_commit(w);
    return false;
}

void outbox_worker_commit(OutboxWorker *w) {
    SPI_finish();
    PopActiveSnapshot();
    CommitTransactionCommand();
    MemoryContextSwitchTo(w->turn_context);
    pgstat_report_stat(false);
    pgstat_report_activity(STATE_IDLE, nullptr);
}

void outbox_worker_wait(OutboxWorker *w, long timeout_ms) {
    WaitEvent events[3];
    int n = WaitEventSetWait(w->wait_set, timeout_ms, events, lengthof(events), PG_WAIT_EXTENSION);
    for (int i = 0; i < n; i++) {
        if (events[i].events & WL_LATCH_SET) {
            ResetLatch(MyLatch);
            w->woken = true;
        }
        if ((events[i].events & WL_SOCKET_READABLE) && w->wake_pipe[0] >= 0) {
            char buf[64];
            while (read(w->wake_pipe[0], buf, sizeof buf) > 0) {
            }
        }
    }
    CHECK_FOR_INTERRUPTS();
}

void outbox_worker_wait_kafka(OutboxWorker *w, long timeout_ms) {
    if (!w->kafka_wait_set) {
        outbox_worker_wait(w, timeout_ms);
        return;
    }
    WaitEvent events[2];
    int n = WaitEventSetWait(w->kafka_wait_set, timeout_ms, events, lengthof(events),
                             PG_WAIT_EXTENSION);
    for (int i = 0; i < n; i++)
        if (events[i].events & WL_SOCKET_READABLE) {
            char buf[64];
            while (read(w->wake_pipe[0], buf, sizeof buf) > 0) {
            }
        }
    if (MyLatch->is_set) w->woken = true;
    CHECK_FOR_INTERRUPTS();
}

void outbox_worker_emit_log_lines(OutboxWorker *w, const outbox::kafka::LogBuffer &log) {
    for (std::size_t i = 0; i < log.count(); i++) {
        int level = log.level(i) == outbox::kafka::LogLevel::Warning ? WARNING
                    : log.level(i) == outbox::kafka::LogLevel::Info  ? LOG
                                                                     : DEBUG1;
        ereport(level, (errmsg("%s: %s", w->label, log.text(i))));
    }
}

void outbox_worker_emit_log(OutboxWorker *w, outbox::kafka::LogBuffer &log) {
    outbox_worker_emit_log_lines(w, log);
    log.clear();
}

bool outbox_worker_load_secrets(OutboxWorker *w, std::vector<outbox::kafka::Property> &secrets,
                                bool was_ok, outbox::SaidOnce &said, const char *stops) {
    char err[512];
    bool ok = outbox::kafka::load_secrets_file(outbox_kafka_config_file, secrets, err, sizeof err);
    if (!ok && (said.first_time(err) || was_ok)) {
        ereport(WARNING, (errmsg("%s: %s; nothing is %s until it is fixed", w->label, err, stops)));
        outbox_stats_error(err);
    }
    return ok;
}

bool outbox_worker_subtransaction(void (*fn)(void *), void *arg, char **error,
                                  int *sqlerrcode) {
    MemoryContext cxt = CurrentMemoryContext;
    ResourceOwner owner = CurrentResourceOwner;
    volatile bool ok = true;
    BeginInternalSubTransaction(nullptr);
    MemoryContextSwitchTo(cxt);
    PG_TRY();
    {
        fn(arg);
        ReleaseCurrentSubTransaction();
        MemoryContextSwitchTo(cxt);
        CurrentResourceOwner = owner;
    }
    PG_CATCH();
    {
        // Aborting the subtransaction also restores the user id, the
        // security context and the settings it began with.
        MemoryContextSwitchTo(cxt);
        ErrorData *edata = CopyErrorData();
        FlushErrorState();
        RollbackAndReleaseCurrentSubTransaction();
        MemoryContextSwitchTo(cxt);
        CurrentResourceOwner = owner;
        *error = pstrdup(edata->message);
        if (sqlerrcode) *sqlerrcode = edata->sqlerrcode;
        FreeErrorData(edata);
        ok = false;
    }
    PG_END_TRY();
    return ok;
}

OutboxSubtransaction outbox_subtransaction_begin(void) {
    OutboxSubtransaction s = {CurrentMemoryContext, CurrentResourceOwner};
    BeginInternalSubTransaction(nullptr);
    MemoryContextSwitchTo(s.cxt);
    return s;
}

void outbox_subtransaction_end(const OutboxSubtransaction *s, bool keep) {
    if (keep)
        ReleaseCurrentSubTransaction();
    else
        RollbackAndReleaseCurrentSubTransaction();
    MemoryContextSwitchTo(s->cxt);
    CurrentResourceOwner = s->owner;
}

namespace {

// The worker's label for log lines, "pg outbox relay 2 [app]"; true when it
// carries the share's number.  Relays are numbered even alone, as
// outbox.worker_stats numbers them.
bool set_label(OutboxWorker *w, OutboxWorkerRole role) {
    const char *name = outbox_role_name(w->kind->role);
    bool numbered = w->share.count > 1 || role == OUTBOX_ROLE_RELAY;
    if (numbered)
        snprintf(w->label, sizeof w->label, "pg outbox %s %d [%s]", name, w->share.index + 1,
                 w->dbname);
    else
        snprintf(w->label, sizeof w->label, "pg outbox %s [%s]", name, w->dbname);
    return numbered;
}

}  // namespace

void outbox_worker_main(const OutboxWorkerKind *kind, Datum main_arg) {
    pqsignal(SIGHUP, SignalHandlerForConfigReload);
    pqsignal(SIGTERM, kind->on_sigterm == OutboxOnSigterm::kCancelTurn ? die
                                                                     : SignalHandlerForShutdownRequest);
    BackgroundWorkerUnblockSignals();

    auto *w = static_cast<OutboxWorker *>(MemoryContextAllocZero(TopMemoryContext,
                                                                 sizeof(OutboxWorker)));
    w->kind = kind;
    w->slot = DatumGetInt32(main_arg);
    OutboxWorkerRole role;
    outbox_slot_identity(w->slot, &role, &w->database_index, &w->share.index);
    w->share.count = outbox_shares(role);
    w->dbname = outbox_database_name(w->database_index);
    w->wake_pipe[0] = w->wake_pipe[1] = -1;
    w->said_schema = -1;
    bool numbered = set_label(w, role);

    BackgroundWorkerInitializeConnection(w->dbname, nullptr, 0);
    // What user code gets: the path a session of this database starts with.
    user_search_path = MemoryContextStrdup(
        TopMemoryContext, GetConfigOption("search_path", false, false));
    pin_session_settings(kind->planner);
    apply_wal_compression();
    char appname[64];
    snprintf(appname, sizeof appname, "pg outbox %s", outbox_role_name(kind->role));
    pgstat_report_appname(appname);
    outbox_slot_attach(w->slot, role, w->share.index, MyDatabaseId);

    w->wait_set = outbox::pg::create_process_wait_set(3);
    AddWaitEventToSet(w->wait_set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, nullptr);
    AddWaitEventToSet(w->wait_set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, nullptr, nullptr);
    if (kind->kafka == OutboxKafka::kPipe) {
        if (pipe2(w->wake_pipe, O_NONBLOCK | O_CLOEXEC) != 0)
            ereport(FATAL, (errmsg("%s: could not create a pipe: %m", w->label)));
        AddWaitEventToSet(w->wait_set, WL_SOCKET_READABLE, w->wake_pipe[0], nullptr, nullptr);
        w->kafka_wait_set = outbox::pg::create_process_wait_set(2);
        AddWaitEventToSet(w->kafka_wait_set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, nullptr,
                          nullptr);
        AddWaitEventToSet(w->kafka_wait_set, WL_SOCKET_READABLE, w->wake_pipe[0], nullptr,
                          nullptr);
    }
    w->turn_context = AllocSetContextCreate(TopMemoryContext, "pg outbox worker turn",
                                            ALLOCSET_DEFAULT_SIZES);

    if (numbered)
        ereport(LOG, (errmsg("%s started (share %d of %d)", w->label, w->share.index + 1,
                             w->share.count)));
    else
        ereport(LOG, (errmsg("%s started", w->label)));
    if (kind->start) kind->start(w);

    for (;;) {
        CHECK_FOR_INTERRUPTS();
        if (ShutdownRequestPending) break;
        if (ConfigReloadPending) {
            ConfigReloadPending = false;
            ProcessConfigFile(PGC_SIGHUP);
            apply_wal_compression();
            if (kind->reload) kind->reload(w);
        }
        MemoryContextReset(w->turn_context);
        MemoryContextSwitchTo(w->turn_context);
        long sleep_ms = kind->turn(w);
        if (sleep_ms != 0 && !ShutdownRequestPending) outbox_worker_wait(w, sleep_ms);
    }

    if (kind->stop) kind->stop(w);
    ereport(LOG, (errmsg("%s stopped", w->label)));
    // Not 0: the postmaster starts a worker that exits 0 never again.
    proc_exit(1);
}
