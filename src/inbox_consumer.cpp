// The inbox consumer, one per database (outbox.inbox).
//
// Reads the topics of outbox.inbox_topics as consumer group
// <outbox.inbox_group>-<database> (default outbox-<database>: every
// database has its own group, so each gets every record) and, batch by batch:
//   1. stores the records in outbox.inbox_message in one transaction (an
//      event_id known for the record's topic is a no-op; a record without a
//      UUID event_id header gets one derived from where and when it is in
//      Kafka, and outbox.inbox_intake counts those whose header was there
//      but unusable);
//   2. commits that transaction with synchronous_commit = on, whatever the
//      server or the database says, so that the rows are on disk;
//   3. wakes the handlers, and only then commits the batch's offsets.
// A crash anywhere loses nothing: before 2 the records come again; between
// 2 and 3 they come again and are dropped as duplicates.  A batch holds at
// most outbox.batch_size records and outbox.inbox_batch_bytes of them (and
// one record more).  A record that cannot be stored at all (an error that
// is not its value's) is not skipped: the batch is rewound to it, its
// SQLSTATE and topic reach outbox.worker_stats, and it is tried again after
// a pause.  The error's own text, which may quote the record, is logged
// only at DEBUG1.
//
// Each record is kept whole: its value's and key's exact bytes (value,
// key_bytes), and, for handlers, the key as text, the value as JSON and the
// headers as a JSON object, all in the database's encoding, and the headers'
// exact bytes (header_names, header_values).  A value that is
// not JSON, or that holds a character the database's encoding lacks, is
// {"raw_base64": ...}; a key or header with such a character has it written
// as \xNN escapes of its UTF-8; a value jsonb refuses is {"raw_text": ...}
// (the batch is then stored record by record).  No record is ever dropped.
//
// Boundary: as in the relay, Postgres-side functions hold no C++ object
// with a destructor; the Consumer lives in process-wide state and is used
// through its noexcept API.

#include <memory>
#include <new>
#include <string>
#include <vector>

#include "outbox/common/list.h"
#include "outbox/common/said_once.h"
#include "outbox/json/record.h"
#include "outbox/kafka/config.h"
#include "outbox/kafka/consumer.h"

#include "outbox/encoding.h"
#include "outbox/guc.h"
#include "outbox/kafka_link.h"
#include "outbox/queries/inbox.h"
#include "outbox/shmem.h"
#include "outbox/worker_common.h"
#include "outbox/workers.h"

extern "C" {
#include "catalog/namespace.h"
#include "storage/ipc.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/json.h"
#include "utils/memutils.h"
}

namespace {

using outbox::kafka::Consumer;
using outbox::kafka::report_error;

struct ConsumerState {
    std::unique_ptr<Consumer> consumer;
    OutboxKafkaLink link;  // what the consumer was built from; the secrets file
    bool said_idle = false;
    long backoff_ms = 0;        // after a record that could not be stored
    TimestampTz retry_at = 0;   // ... the next poll not before then
    outbox::SaidOnce said_store_error;
    outbox::SaidOnce said_commit_error;
};

ConsumerState *state(OutboxWorker *w) { return static_cast<ConsumerState *>(w->state); }

// ---- C++ side: never calls Postgres, never throws ----

bool consumer_connect(ConsumerState *st, int wake_fd, const char *brokers, const char *extra,
                      const char *group, const char *client_id, const char *topics, char *err,
                      std::size_t errlen) noexcept {
    try {
        outbox::kafka::ConsumerSettings s;
        s.client = {brokers, client_id, extra, st->link.secrets};
        s.group_id = group;
        std::string error;
        if (!outbox::parse_topic_list(topics, s.topics, error))
            return report_error(err, errlen, "outbox.inbox_topics: " + error);
        st->consumer = Consumer::create(s, wake_fd, error);
        return st->consumer || report_error(err, errlen, error);
    } catch (const std::exception &e) {
        return report_error(err, errlen, e.what());
    }
}

void consumer_disconnect(ConsumerState *st) noexcept {
    if (st) st->consumer.reset();
}

bool rewind_batch(ConsumerState *st, char *err, std::size_t errlen) noexcept {
    try {
        std::string error;
        return st->consumer->rewind(error) || report_error(err, errlen, error);
    } catch (...) {
        return report_error(err, errlen, "out of memory");
    }
}

bool commit_offsets(ConsumerState *st, char *err, std::size_t errlen) noexcept {
    try {
        std::string error;
        return st->consumer->commit(error) || report_error(err, errlen, error);
    } catch (...) {
        return report_error(err, errlen, "out of memory");
    }
}

// ---- Postgres side ----

bytea *to_bytea(const std::string &bytes) {
    auto *b = static_cast<bytea *>(palloc(VARHDRSZ + bytes.size()));
    SET_VARSIZE(b, VARHDRSZ + bytes.size());
    memcpy(VARDATA(b), bytes.data(), bytes.size());
    return b;
}

char *raw_base64(const std::string &bytes) {
    std::size_t n = outbox::json::raw_base64_json_length(bytes.size());
    auto *out = static_cast<char *>(palloc(n + 1));
    outbox::json::write_raw_base64_json(bytes.data(), bytes.size(), out);
    out[n] = '\0';
    return out;
}

// The bytea[] literal of the record's header names or values, for the
// insert's text[] parameters: one array per record, whatever its size.
char *bytea_array_literal(const outbox::kafka::InRecord &r, bool names) {
    std::size_t n = outbox::json::bytea_array_literal_length(r.headers, r.header_has_value, names);
    auto *out = static_cast<char *>(palloc(n + 1));
    outbox::json::write_bytea_array_literal(r.headers, r.header_has_value, names, out);
    out[n] = '\0';
    return out;
}

// Record i of the batch as a row for outbox.inbox_message.
void prepare(ConsumerState *st, std::size_t i, OutboxInboxRow *row) {
    const outbox::kafka::InRecord &r = st->consumer->record(i);
    row->event_id = r.event_id.empty() ? nullptr : r.event_id.c_str();
    row->topic = r.topic.c_str();
    row->partition = r.partition;
    row->offset = r.offset;
    row->timestamp = r.timestamp;
    row->key = r.has_key ? outbox_encoding_from_utf8_escaped(r.key.data(), r.key.size()) : nullptr;
    row->key_bytes = r.has_key ? to_bytea(r.key) : nullptr;
    row->value = r.has_value ? to_bytea(r.value) : nullptr;
    if (!r.has_value) {
        row->payload = "null";
    } else {
        char *json =
            r.value_is_json ? outbox_encoding_from_utf8(r.value.data(), r.value.size()) : nullptr;
        row->payload = json ? json : raw_base64(r.value);
    }
    StringInfoData h;
    initStringInfo(&h);
    appendStringInfoChar(&h, '{');
    for (std::size_t k = 0; k < r.headers.size(); k++) {
        if (k > 0) appendStringInfoString(&h, ", ");
        const std::string &name = r.headers[k].first, &value = r.headers[k].second;
        escape_json(&h, outbox_encoding_from_utf8_escaped(name.data(), name.size()));
        appendStringInfoString(&h, ": ");
        escape_json(&h, outbox_encoding_from_utf8_escaped(value.data(), value.size()));
    }
    appendStringInfoChar(&h, '}');
    row->headers = h.data;
    row->header_names = bytea_array_literal(r, true);
    row->header_values = bytea_array_literal(r, false);
    row->event_id_note = r.event_id_note.empty() ? nullptr : r.event_id_note.c_str();
}

struct StoreCall {
    const OutboxInboxRow *rows;
    int n;
    bool raw;
    int64 inserted;
};

void store_call(void *arg) {
    auto *c = static_cast<StoreCall *>(arg);
    c->inserted += c->raw ? outbox_inbox_insert_raw(c->rows) : outbox_inbox_insert(c->rows, c->n);
}

// Stores rows in a subtransaction; false (the error logged at DEBUG1: it
// may quote a record) when it failed, which rolls back only the
// subtransaction.
bool store_guarded(OutboxWorker *w, const OutboxInboxRow *rows, int n, bool raw,
                   int64 *inserted, int *sqlerrcode = nullptr) {
    StoreCall call{rows, n, raw, 0};
    char *error = nullptr;
    int code = 0;
    if (!outbox_worker_subtransaction(store_call, &call, &error, &code)) {
        ereport(DEBUG1, (errmsg("%s: storing records failed: %s", w->label, error)));
        if (sqlerrcode) *sqlerrcode = code;
        return false;
    }
    *inserted += call.inserted;
    return true;
}

// An error of the value's own (jsonb refuses it: a syntax it does not take,
// \u0000, a size past its limits): the record is kept with its JSON as text.
bool value_error(int sqlerrcode) {
    int cls = ERRCODE_TO_CATEGORY(sqlerrcode);
    return cls == ERRCODE_DATA_EXCEPTION || cls == ERRCODE_PROGRAM_LIMIT_EXCEEDED;
}

// The records of `rows` whose event_id header could not be their id, per
// topic, into outbox.inbox_intake (in the batch's transaction).
void note_intake(OutboxWorker *w, const OutboxInboxRow *rows, int n) {
    for (int i = 0; i < n; i++) {
        if (!rows[i].event_id_note) continue;
        bool seen = false;
        for (int k = 0; k < i && !seen; k++)
            seen = rows[k].event_id_note && strcmp(rows[k].topic, rows[i].topic) == 0;
        if (seen) continue;
        int64 count = 0;
        const char *last = nullptr;
        for (int k = i; k < n; k++)
            if (rows[k].event_id_note && strcmp(rows[k].topic, rows[i].topic) == 0) {
                count++;
                last = rows[k].event_id_note;
            }
        char note[256];
        snprintf(note, sizeof note, "%s: the record's id was derived from its place in Kafka",
                 last);
        outbox_inbox_note_intake(rows[i].topic, count, note);
        ereport(DEBUG1, (errmsg("%s: %lld record(s) of \"%s\" came with %s", w->label,
                                static_cast<long long>(count), rows[i].topic, last)));
    }
}

// A record that could not be stored: what outbox.worker_stats (pg_monitor,
// every database) and the log get names where it is and the SQLSTATE,
// never the error's text (a trigger's or a constraint's message may quote
// the record); the batch is rewound so that it comes again, after a pause.
void refuse_batch(OutboxWorker *w, const OutboxInboxRow &row, int sqlerrcode) {
    ConsumerState *st = state(w);
    const char *code = unpack_sql_state(sqlerrcode);
    st->backoff_ms = st->backoff_ms == 0 ? 1000 : Min(st->backoff_ms * 2, 30000L);
    st->retry_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), st->backoff_ms);
    char text[512];
    snprintf(text, sizeof text,
             "storing a record of topic \"%s\" failed with SQLSTATE %s; it comes again (the "
             "error's text, which may quote the record, is logged at DEBUG1)",
             row.topic, code);
    outbox_stats_error(text);
    char key[320];
    snprintf(key, sizeof key, "%s/%s", code, row.topic);
    if (st->said_store_error.first_time(key)) {
        ereport(WARNING,
                (errmsg("%s: could not store the record at \"%s\" [%d] offset %lld (SQLSTATE %s); "
                        "it comes again, and so do the later records of its batch",
                        w->label, row.topic, row.partition, static_cast<long long>(row.offset),
                        code),
                 errdetail("The error's text may quote the record: it is logged at DEBUG1 only."),
                 errhint("A trigger or a constraint on outbox.inbox_message, or a full disk, "
                         "can cause this; nothing is skipped.")));
    }
    char err[256];
    if (!rewind_batch(st, err, sizeof err)) {
        // Could not seek: start over from the committed offsets.
        ereport(WARNING, (errmsg("%s: rewinding the batch failed (%s); reconnecting", w->label,
                                 err)));
        consumer_disconnect(st);
    }
}

// One batch: store, commit, wake the handlers, commit the offsets.
void store_batch(OutboxWorker *w, int n) {
    ConsumerState *st = state(w);
    if (!outbox_worker_begin(w, "pg outbox: storing inbox records")) {
        // Not stored, offsets not committed: let Kafka hand them out again.
        consumer_disconnect(st);
        return;
    }
    OutboxInboxRow *rows = static_cast<OutboxInboxRow *>(palloc(sizeof(OutboxInboxRow) * n));
    for (int i = 0; i < n; i++) prepare(st, static_cast<std::size_t>(i), &rows[i]);
    int64 inserted = 0;
    int refused = -1, refused_code = 0;
    if (!store_guarded(w, rows, n, false, &inserted)) {
        // Record by record; a value jsonb refuses is kept as text.
        for (int i = 0; i < n && refused < 0; i++) {
            int code = 0;
            if (store_guarded(w, &rows[i], 1, false, &inserted, &code)) continue;
            if (value_error(code) && store_guarded(w, &rows[i], 1, true, &inserted, &code)) {
                ereport(WARNING, (errmsg("%s: the value at %s [%d] offset %lld is not valid jsonb; "
                                         "stored as {\"raw_text\": ...}",
                                         w->label, rows[i].topic, rows[i].partition,
                                         static_cast<long long>(rows[i].offset))));
                continue;
            }
            refused = i;
            refused_code = code;
        }
    }
    if (refused < 0) note_intake(w, rows, n);
    // The records stored before a refused one are kept: they come again
    // with it and are dropped as duplicates.
    outbox_worker_commit(w);
    if (inserted > 0) outbox_wake(OUTBOX_ROLE_INBOX_HANDLER, MyDatabaseId);
    if (refused >= 0) {
        refuse_batch(w, rows[refused], refused_code);
        outbox_stats_add(static_cast<uint64>(inserted), 1, 0);
        return;
    }
    st->backoff_ms = 0;
    st->retry_at = 0;
    st->said_store_error.forget();

    // Only now may Kafka forget them.
    char err[256];
    if (!commit_offsets(st, err, sizeof err)) {
        if (st->said_commit_error.first_time(err))
            ereport(WARNING, (errmsg("%s: committing offsets failed (the records will come again "
                                     "and be dropped as duplicates): %s",
                                     w->label, err)));
        outbox_stats_add(static_cast<uint64>(inserted), 1, 0);
    } else {
        outbox_stats_add(static_cast<uint64>(inserted), 0, 0);
    }
}

void report(OutboxWorker *w) {
    Consumer *c = state(w)->consumer.get();
    if (!c) return;
    outbox_worker_emit_log_lines(w, c->log());
    c->clear_log();
    outbox_link_show_state(&state(w)->link, c->broker_state());
    if (c->last_error()[0]) outbox_stats_error(c->last_error());
}

// Makes the consumer match the settings; false when it should idle.
bool ensure_consumer(OutboxWorker *w) {
    ConsumerState *st = state(w);
    const char *brokers = outbox_brokers ? outbox_brokers : "";
    const char *config = outbox_kafka_config ? outbox_kafka_config : "";
    const char *topics = outbox_inbox_topics ? outbox_inbox_topics : "";
    char group[2 * NAMEDATALEN + 16];
    snprintf(group, sizeof group, "%s-%s",
             outbox_inbox_group && outbox_inbox_group[0] ? outbox_inbox_group : "outbox",
             w->dbname);

    const char *parts[] = {brokers, config, topics, group};
    char *settings = outbox_link_settings(parts, 4);
    if (st->consumer) {
        if (outbox_link_matches(&st->link, settings, st->consumer->secrets()) &&
            !st->consumer->fatal())
            return true;
        ereport(LOG, (errmsg("%s: settings changed, reconnecting", w->label)));
        consumer_disconnect(st);
    }
    if (brokers[0] == '\0' || topics[0] == '\0' || !st->link.secrets_ok) {
        if (!st->said_idle && st->link.secrets_ok)
            ereport(LOG, (errmsg("%s: idle (outbox.inbox_topics or outbox.brokers is empty)",
                                 w->label)));
        st->said_idle = true;
        return false;
    }
    st->said_idle = false;
    char client_id[NAMEDATALEN + 32];
    snprintf(client_id, sizeof client_id, "pg_outbox-inbox-%s", w->dbname);
    char err[512];
    if (!consumer_connect(st, w->wake_pipe[1], brokers, config, group, client_id, topics, err,
                          sizeof err)) {
        outbox_link_connect_failed(w, &st->link, "consumer", err);
        return false;
    }
    outbox_link_connected(&st->link, settings);
    ereport(LOG, (errmsg("%s: consuming %s from %s as group %s", w->label, topics, brokers, group)));
    return true;
}

void consumer_reload(OutboxWorker *w) {
    ConsumerState *st = state(w);
    outbox_link_reload(w, &st->link, "consumed");
}

void consumer_on_exit(int, Datum arg) {
    consumer_disconnect(reinterpret_cast<ConsumerState *>(DatumGetPointer(arg)));
}

void consumer_start(OutboxWorker *w) {
    ConsumerState *st = outbox_worker_new_state<ConsumerState>(w);
    // The offsets are committed after the rows: the rows must be on disk by
    // then, whatever the server, the database or a role says.
    SetConfigOption("synchronous_commit", "on", PGC_SUSET, PGC_S_SESSION);
    consumer_reload(w);
    before_shmem_exit(consumer_on_exit, PointerGetDatum(st));
}

long consumer_turn(OutboxWorker *w) {
    ConsumerState *st = state(w);
    if (!ensure_consumer(w)) return outbox_poll_interval_ms;
    if (st->retry_at != 0) {
        // A record could not be stored: wait before it comes again.
        long left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), st->retry_at);
        if (left > 0) return left;
    }
    int n = static_cast<int>(st->consumer->poll_batch(
        static_cast<std::size_t>(outbox_batch_size),
        static_cast<std::size_t>(outbox_inbox_batch_bytes_kb) * 1024));
    report(w);
    if (n == 0) return outbox_poll_interval_ms;  // the pipe wakes us when records arrive
    store_batch(w, n);
    report(w);
    return st->backoff_ms;
}

void consumer_stop(OutboxWorker *w) {
    if (ConsumerState *st = state(w)) {
        if (st->consumer) st->consumer->close();
        consumer_disconnect(st);
    }
}

const OutboxWorkerKind kConsumer = {
    OUTBOX_ROLE_INBOX_CONSUMER,
    OutboxOnSigterm::kFinishTurn,
    OutboxKafka::kPipe,
    OutboxPlanner::kCommon,
    kOutboxSchema14,
    consumer_start,
    consumer_turn,
    consumer_reload,
    consumer_stop,
};

}  // namespace

void outbox_inbox_consumer_main(Datum main_arg) { outbox_worker_main(&kConsumer, main_arg); }
