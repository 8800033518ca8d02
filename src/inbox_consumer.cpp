// The inbox consumer background worker, one per database (outbox.inbox).
//
// Reads the topics of outbox.inbox_topics as consumer group
// outbox.inbox_group (default outbox-<database>) and, batch by batch:
//   1. stores the records in outbox.inbox_message in one transaction (a
//      known event_id is a no-op; a record without a UUID event_id header
//      gets one derived from topic/partition/offset);
//   2. commits that transaction, wakes the inbox handler;
//   3. only then commits the batch's offsets to Kafka.
// A crash anywhere loses nothing: before 2 the records come again; between
// 2 and 3 they come again and are dropped as duplicates.
//
// A value Postgres' jsonb refuses makes the batch insert fail; the batch is
// then stored record by record, each in a subtransaction, and a refused
// value is kept as {"raw_text": ...}: no record is ever dropped.
//
// Boundary: as in the relay, Postgres-side functions hold no C++ object
// with a destructor; the Consumer lives in process-wide state and is used
// through its noexcept API.

#include <fcntl.h>
#include <unistd.h>

#include <memory>
#include <new>
#include <string>

#include "outbox/kafka/consumer.h"

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
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"
}

namespace {

using outbox::kafka::Consumer;

struct ConsumerState {
    std::unique_ptr<Consumer> consumer;
    char label[NAMEDATALEN + 40] = "";
    const char *dbname = "";
    char *built_brokers = nullptr;
    char *built_config = nullptr;
    char *built_topics = nullptr;
    char *built_group = nullptr;
    int wake_pipe[2] = {-1, -1};
    WaitEventSet *wait_set = nullptr;
    MemoryContext loop_context = nullptr;
    char last_error[256] = "";
    char last_commit_error[256] = "";
    bool said_idle = false;
};

ConsumerState *st = nullptr;

// ---- C++ side: never calls Postgres, never throws ----

bool consumer_connect(const char *brokers, const char *extra, const char *group,
                      const char *client_id, const char *topics, char *err,
                      std::size_t errlen) noexcept {
    try {
        outbox::kafka::ConsumerSettings s;
        s.brokers = brokers;
        s.extra = extra;
        s.group_id = group;
        s.client_id = client_id;
        std::string list(topics);
        std::size_t pos = 0;
        while (pos <= list.size()) {
            std::size_t comma = list.find(',', pos);
            if (comma == std::string::npos) comma = list.size();
            std::string t = list.substr(pos, comma - pos);
            std::size_t b = t.find_first_not_of(" \t"), e = t.find_last_not_of(" \t");
            if (b != std::string::npos) s.topics.push_back(t.substr(b, e - b + 1));
            pos = comma + 1;
        }
        std::string error;
        st->consumer = Consumer::create(s, st->wake_pipe[1], error);
        if (!st->consumer) snprintf(err, errlen, "%s", error.c_str());
        return st->consumer != nullptr;
    } catch (const std::exception &e) {
        snprintf(err, errlen, "%s", e.what());
        return false;
    }
}

void consumer_disconnect() noexcept { st->consumer.reset(); }

// Copies a batch record's strings out, for the Postgres side.
struct RecordView {
    const char *event_id;  // nullptr: none
    const char *topic;
    const char *key;  // nullptr: no key
    const char *payload;
    const char *headers;
    int32 partition;
    int64 offset;
};

void view_record(std::size_t i, RecordView *v) noexcept {
    const outbox::kafka::InRecord &r = st->consumer->record(i);
    v->event_id = r.event_id.empty() ? nullptr : r.event_id.c_str();
    v->topic = r.topic.c_str();
    v->key = r.has_key ? r.key.c_str() : nullptr;
    v->payload = r.payload_json.c_str();
    v->headers = r.headers_json.c_str();
    v->partition = r.partition;
    v->offset = r.offset;
}

bool commit_offsets(char *err, std::size_t errlen) noexcept {
    try {
        std::string error;
        if (st->consumer->commit(error)) return true;
        snprintf(err, errlen, "%s", error.c_str());
        return false;
    } catch (...) {
        snprintf(err, errlen, "out of memory");
        return false;
    }
}

// ---- Postgres side ----

char *keep_string(char *old, const char *value) {
    if (old) pfree(old);
    return MemoryContextStrdup(TopMemoryContext, value ? value : "");
}

void wait_events(long timeout_ms) { outbox_worker_wait(st->wait_set, st->wake_pipe[0], timeout_ms); }

void emit_log() {
    Consumer *c = st->consumer.get();
    if (!c) return;
    for (std::size_t i = 0; i < c->log_count(); i++) {
        int level = c->log_level(i) == outbox::kafka::LogLevel::Warning ? WARNING
                    : c->log_level(i) == outbox::kafka::LogLevel::Info  ? LOG
                                                                        : DEBUG1;
        ereport(level, (errmsg("%s: %s", st->label, c->log_text(i))));
    }
    c->clear_log();
    outbox_stats_set_broker_state(c->broker_state() == outbox::kafka::BrokerState::Up ? OUTBOX_BROKER_UP
                                  : c->broker_state() == outbox::kafka::BrokerState::Down
                                      ? OUTBOX_BROKER_DOWN
                                      : OUTBOX_BROKER_UNKNOWN);
    if (c->last_error()[0] && strcmp(c->last_error(), st->last_error) != 0) {
        outbox_stats_error(c->last_error());
        strlcpy(st->last_error, c->last_error(), sizeof st->last_error);
    }
}

// Stores records [from, from + n) of the batch.  Inside a transaction with
// SPI connected; may ereport(ERROR).  Returns the rows inserted.
int64 store(int from, int n, bool raw) {
    OutboxInboxRow *rows = static_cast<OutboxInboxRow *>(palloc(sizeof(OutboxInboxRow) * n));
    for (int i = 0; i < n; i++) {
        RecordView v;
        view_record(static_cast<std::size_t>(from + i), &v);
        rows[i] = OutboxInboxRow{v.event_id, v.topic, v.key, v.payload, v.headers, v.partition,
                                 v.offset};
    }
    return raw ? outbox_inbox_insert_raw(&rows[0]) : outbox_inbox_insert(rows, n);
}

struct StoreCall {
    int from;
    int n;
    bool raw;
    int64 inserted;
};

void store_call(void *arg) {
    auto *c = static_cast<StoreCall *>(arg);
    c->inserted += store(c->from, c->n, c->raw);
}

// Runs store() in a subtransaction; false (the error logged at DEBUG1) when
// it failed, which rolls back only the subtransaction.
bool store_guarded(int from, int n, bool raw, int64 *inserted) {
    StoreCall call{from, n, raw, 0};
    char *error = nullptr;
    if (!outbox_worker_subtransaction(store_call, &call, &error)) {
        ereport(DEBUG1, (errmsg("%s: storing records failed: %s", st->label, error)));
        return false;
    }
    *inserted += call.inserted;
    return true;
}

// One batch: store, commit, wake the handler, commit the offsets.
void handle_batch(int n) {
    outbox_worker_begin("pg outbox: storing inbox records");
    int64 inserted = 0;
    if (!outbox_extension_ready())
        ereport(ERROR, (errmsg("%s: the outbox extension is not installed in database \"%s\"",
                               st->label, st->dbname)));
    if (!store_guarded(0, n, false, &inserted)) {
        // Record by record; a value jsonb refuses is kept as text.
        for (int i = 0; i < n; i++)
            if (!store_guarded(i, 1, false, &inserted)) {
                ereport(WARNING, (errmsg("%s: record at %s [%d] offset %lld is not valid jsonb; "
                                         "stored as {\"raw_text\": ...}",
                                         st->label, st->consumer->record(i).topic.c_str(),
                                         st->consumer->record(i).partition,
                                         static_cast<long long>(st->consumer->record(i).offset))));
                inserted += store(i, 1, true);
            }
    }
    outbox_worker_commit(st->loop_context);
    outbox_wake(OUTBOX_ROLE_INBOX_HANDLER, MyDatabaseId);

    // Only now may Kafka forget them.
    char err[256];
    if (!commit_offsets(err, sizeof err)) {
        if (strcmp(err, st->last_commit_error) != 0)
            ereport(WARNING, (errmsg("%s: committing offsets failed (the records will come again "
                                     "and be dropped as duplicates): %s",
                                     st->label, err)));
        strlcpy(st->last_commit_error, err, sizeof st->last_commit_error);
        outbox_stats_add(static_cast<uint64>(n), 1, 0);
    } else {
        st->last_commit_error[0] = '\0';
        outbox_stats_add(static_cast<uint64>(n), 0, 0);
    }
    (void) inserted;
}

// Makes the consumer match the settings; false when it should idle.
bool ensure_consumer() {
    const char *brokers = outbox_brokers ? outbox_brokers : "";
    const char *config = outbox_kafka_config ? outbox_kafka_config : "";
    const char *topics = outbox_inbox_topics ? outbox_inbox_topics : "";
    char group[NAMEDATALEN + 16];
    if (outbox_inbox_group && outbox_inbox_group[0])
        strlcpy(group, outbox_inbox_group, sizeof group);
    else
        snprintf(group, sizeof group, "outbox-%s", st->dbname);

    if (st->consumer) {
        if (strcmp(brokers, st->built_brokers) == 0 && strcmp(config, st->built_config) == 0 &&
            strcmp(topics, st->built_topics) == 0 && strcmp(group, st->built_group) == 0 &&
            !st->consumer->fatal())
            return true;
        ereport(LOG, (errmsg("%s: settings changed, reconnecting", st->label)));
        consumer_disconnect();
    }
    if (brokers[0] == '\0' || topics[0] == '\0') {
        if (!st->said_idle)
            ereport(LOG, (errmsg("%s: idle (outbox.inbox_topics or outbox.brokers is empty)",
                                 st->label)));
        st->said_idle = true;
        return false;
    }
    st->said_idle = false;
    char client_id[NAMEDATALEN + 32];
    snprintf(client_id, sizeof client_id, "pg_outbox-inbox-%s", st->dbname);
    char err[512];
    if (!consumer_connect(brokers, config, group, client_id, topics, err, sizeof err)) {
        ereport(WARNING, (errmsg("%s: cannot create the Kafka consumer: %s", st->label, err)));
        outbox_stats_error(err);
        return false;
    }
    st->built_brokers = keep_string(st->built_brokers, brokers);
    st->built_config = keep_string(st->built_config, config);
    st->built_topics = keep_string(st->built_topics, topics);
    st->built_group = keep_string(st->built_group, group);
    ereport(LOG, (errmsg("%s: consuming %s from %s as group %s", st->label, topics, brokers, group)));
    return true;
}

void consumer_iteration() {
    if (ConfigReloadPending) {
        ConfigReloadPending = false;
        ProcessConfigFile(PGC_SIGHUP);
    }
    if (!ensure_consumer()) {
        wait_events(outbox_poll_interval_ms);
        return;
    }
    int n = static_cast<int>(st->consumer->poll_batch(static_cast<std::size_t>(outbox_batch_size)));
    emit_log();
    if (n == 0) {
        wait_events(outbox_poll_interval_ms);
        return;
    }
    handle_batch(n);
}

void on_exit(int, Datum) {
    if (st) consumer_disconnect();
}

}  // namespace

extern "C" PGDLLEXPORT void outbox_inbox_consumer_main(Datum main_arg);

void outbox_inbox_consumer_main(Datum main_arg) {
    pqsignal(SIGHUP, SignalHandlerForConfigReload);
    pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
    BackgroundWorkerUnblockSignals();

    int slot = DatumGetInt32(main_arg);
    int database_index = slot - outbox_inbox_consumer_slot(0);
    const char *dbname = outbox_database_name(database_index);
    BackgroundWorkerInitializeConnection(dbname, nullptr, 0);
    SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_OVERRIDE);
    pgstat_report_appname("pg outbox inbox consumer");

    // nothrow: no C++ exception may unwind into Postgres code.
    st = new (std::nothrow) ConsumerState();
    if (!st) ereport(FATAL, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("out of memory")));
    st->dbname = dbname;
    snprintf(st->label, sizeof st->label, "pg outbox inbox consumer [%s]", dbname);
    st->built_brokers = keep_string(nullptr, "");
    st->built_config = keep_string(nullptr, "");
    st->built_topics = keep_string(nullptr, "");
    st->built_group = keep_string(nullptr, "");
    outbox_slot_attach(slot, OUTBOX_ROLE_INBOX_CONSUMER, 0, MyDatabaseId);
    outbox_worker_pipe(st->wake_pipe, st->label);
    st->wait_set = outbox_worker_wait_set(st->wake_pipe[0]);
    before_shmem_exit(on_exit, 0);
    ereport(LOG, (errmsg("%s started", st->label)));

    st->loop_context = AllocSetContextCreate(TopMemoryContext, "pg outbox inbox consumer",
                                             ALLOCSET_DEFAULT_SIZES);
    while (!ShutdownRequestPending) {
        MemoryContextSwitchTo(st->loop_context);
        PG_TRY();
        {
            consumer_iteration();
        }
        PG_CATCH();
        {
            outbox_worker_recover(st->loop_context);
            // The batch was not stored and its offsets not committed: drop
            // the consumer so that Kafka hands the records out again.
            consumer_disconnect();
            wait_events(1000);
        }
        PG_END_TRY();
        MemoryContextReset(st->loop_context);
    }
    consumer_disconnect();
    ereport(LOG, (errmsg("%s stopped", st->label)));
    proc_exit(0);
}
