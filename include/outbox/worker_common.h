// The one life-cycle of every background worker of the extension (relay,
// maintenance, inbox consumer, inbox handler).  A worker kind supplies its
// turn; the skeleton does the rest, the same way for all four:
//
//   start    signals, the database of its slot, the session settings its own
//            statements need (search_path = pg_catalog, pg_temp and the rest,
//            and the kind's planner pins, whatever a database or role setting
//            says), its label and
//            application name, its shared memory slot, a wake-up pipe for
//            librdkafka when it talks to Kafka;
//   loop     a reload point (SIGHUP), then one turn in a memory context reset
//            each time, then a sleep on the latch, the pipe and postmaster
//            death for as long as the turn asked;
//   errors   none is caught here: an ERROR ends the process (a background
//            worker's ERROR is FATAL) and the postmaster starts it again after
//            bgw_restart_time.  Nothing depends on cleanup running: what was
//            not committed stays pending and is done again;
//   SIGTERM  the worker exits with code 1, so that the postmaster starts it
//            again (pg_terminate_backend, a DBA's script) unless the server is
//            stopping.  A worker that runs user code (the inbox handler)
//            stops at once: SIGTERM is Postgres' `die`, so the handler's
//            statement is cancelled like a backend's.  The others finish
//            their turn first (bounded by outbox.batch_timeout), so that a
//            clean stop sends nothing twice.
#pragma once

#include <new>
#include <vector>

#include "outbox/common/said_once.h"
#include "outbox/kafka/client.h"

#include "outbox/pg.h"
#include "outbox/share.h"
#include "outbox/shmem.h"

extern "C" {
#include "storage/latch.h"
#include "utils/resowner.h"
}

// Schema versions as outbox_schema_version() gives them: 100 for 1.0, 110
// for 1.1, 120 for 1.2, 130 for 1.3, 140 for 1.4, 150 for 1.5, 160 for 1.6; 0 when the extension is not installed.
inline constexpr int kOutboxSchema10 = 100;
inline constexpr int kOutboxSchema11 = 110;
inline constexpr int kOutboxSchema12 = 120;
inline constexpr int kOutboxSchema13 = 130;
inline constexpr int kOutboxSchema14 = 140;
inline constexpr int kOutboxSchema15 = 150;
inline constexpr int kOutboxSchema16 = 160;

struct OutboxWorker;

// How a kind's own statements are planned, on top of the settings every
// worker pins (worker_common.cpp): the skeleton turns these planner methods
// off at start, as a session's SET would, whatever a database or role
// setting says.
enum class OutboxPlanner {
    kCommon,      // the common pins only
    // A queue is read in index order, whatever the statistics say: a
    // backlog that arrived before autovacuum analysed the table must not
    // turn each claim into a sequential scan and a full sort.  No
    // sequential or bitmap scan.
    kIndexOrder,
    // A topic is read through its index, in order: with no sequential or
    // bitmap scan and no sort, the one plan left is that walk
    // (sql/plans.sql).
    kIndexOrderNoSort,
};

// The planner methods `planner` turns off, nullptr-terminated: a worker
// that runs user code gives it the database's values back.
const char *const *outbox_planner_off(OutboxPlanner planner);

// What SIGTERM does to a worker of the kind.
enum class OutboxOnSigterm {
    kFinishTurn,  // the turn ends first, so that a clean stop sends nothing twice
    kCancelTurn,  // it runs user code: SIGTERM cancels the turn like a backend's statement
};

// Whether the kind talks to Kafka.
enum class OutboxKafka {
    kNone,
    kPipe,  // a pipe librdkafka writes to when it has something
};

struct OutboxWorkerKind {
    OutboxWorkerRole role;  // its name is outbox_role_name(role) (workers.h)
    OutboxOnSigterm on_sigterm;
    OutboxKafka kafka;
    OutboxPlanner planner;  // how its own statements are planned
    int needs_schema;   // the oldest schema version its statements work with
    void (*start)(OutboxWorker *w);   // once connected; may be nullptr
    // One turn; returns how long to sleep after it, in ms: 0 goes again at
    // once, -1 sleeps until woken.
    long (*turn)(OutboxWorker *w);
    void (*reload)(OutboxWorker *w);  // after SIGHUP reloaded the settings; may be nullptr
    void (*stop)(OutboxWorker *w);    // after SIGTERM, before exiting; may be nullptr
};

struct OutboxWorker {
    const OutboxWorkerKind *kind;
    int slot;
    int database_index;
    OutboxShare share;  // its share of the keys (relay, inbox handler)
    const char *dbname;
    char label[NAMEDATALEN + 48];  // "pg outbox relay 2 [app]", for log lines
    MemoryContext turn_context;    // reset before every turn
    WaitEventSet *wait_set;
    WaitEventSet *kafka_wait_set;  // the pipe and postmaster death, no latch
    int wake_pipe[2];   // librdkafka writes here when it has something; -1 without Kafka
    bool woken;         // the latch was set since the kind last cleared this
    int schema;         // the schema version the last outbox_worker_begin() saw
    int said_schema;    // the schema state last logged, to say each once
    outbox::SaidOnce said_unsafe;  // why schema "outbox" was last refused (nothing: it is not)
    void *state;        // the kind's own
};

// The main function of a worker of `kind`: never returns.
[[noreturn]] void outbox_worker_main(const OutboxWorkerKind *kind, Datum main_arg);

// Starts a transaction with SPI connected and a snapshot, reporting
// `activity` in pg_stat_activity, and checks that the extension here is at
// least the schema version the kind needs, in a schema only superusers
// control (outbox_schema_unsafe).  When it is not, ends the transaction,
// says so in the log (once per change) and returns false.
bool outbox_worker_begin(OutboxWorker *w, const char *activity);

// Commits it; the turn's memory context is current again.
void outbox_worker_commit(OutboxWorker *w);

// Sleeps up to timeout_ms (-1: no limit) on the latch, the wake-up pipe and
// postmaster death (the worker exits).  Sets w->woken when the latch was set.
void outbox_worker_wait(OutboxWorker *w, long timeout_ms);

// Sleeps up to timeout_ms on the wake-up pipe (librdkafka has something)
// and postmaster death only: commits that set the latch meanwhile do not
// wake the worker (under load each would), but are noted in w->woken.
void outbox_worker_wait_kafka(OutboxWorker *w, long timeout_ms);

// Writes librdkafka's and the client's lines to the server log, prefixed
// with the worker's label, and empties the buffer.
void outbox_worker_emit_log(OutboxWorker *w, outbox::kafka::LogBuffer &log);
void outbox_worker_emit_log_lines(OutboxWorker *w, const outbox::kafka::LogBuffer &log);

// Reads outbox.kafka_config_file into `secrets` (a worker's own, kept in
// its state).  When it cannot be used, says why in the log (once per
// distinct reason, kept in `said`) and what waits: "nothing is <stops>".
bool outbox_worker_load_secrets(OutboxWorker *w, std::vector<outbox::kafka::Property> &secrets,
                                bool was_ok, outbox::SaidOnce &said, const char *stops);

// Runs fn(arg) in a subtransaction of the current transaction (with SPI
// connected).  On an ERROR only the subtransaction is rolled back: returns
// false with the error's message, palloc'd, in *error, and its SQLSTATE in
// *sqlerrcode (when given).
bool outbox_worker_subtransaction(void (*fn)(void *), void *arg, char **error,
                                  int *sqlerrcode = nullptr);

// A subtransaction held open across other work (the relay marks a Kafka
// transaction's rows while Kafka commits it): begun, then ended keeping
// what it did or rolling it back.  An ERROR inside it aborts the whole
// transaction, as any ERROR of a worker does.
struct OutboxSubtransaction {
    MemoryContext cxt;
    ResourceOwner owner;
};
OutboxSubtransaction outbox_subtransaction_begin(void);
void outbox_subtransaction_end(const OutboxSubtransaction *s, bool keep);

// The search_path a session of this database starts with (its ALTER
// DATABASE setting, else postgresql.conf's): what user code (handlers) runs
// with.  The worker's own statements never use it.
const char *outbox_worker_user_search_path(void);

// The schema version of the extension in this database (see above).  Inside
// a transaction.
int outbox_schema_version(void);

// Why the schema named "outbox" may not be used by name (nullptr: it may):
// the extension's schema (`extension_schema`) is owned by a role that is
// not a superuser, or the name resolves to another schema.  Inside a
// transaction.
const char *outbox_schema_unsafe(Oid extension_schema);

// The role that owns the extension here (InvalidOid when not installed).
// Inside a transaction.
Oid outbox_extension_owner(void);

// A new, value-initialised T as the kind's state (w->state), for kinds whose
// state owns C++ objects.  FATAL when memory runs out: nothrow, since no
// C++ exception may unwind into Postgres code.
template <class T>
T *outbox_worker_new_state(OutboxWorker *w) {
    T *st = new (std::nothrow) T();
    if (!st) ereport(FATAL, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("out of memory")));
    w->state = st;
    return st;
}

// A copy of `value` in TopMemoryContext, freeing `old`.
char *outbox_keep_string(char *old, const char *value);
