// The relay background worker.
//
// One worker per share of the message keys (outbox.workers).  Each turn:
//
//   1. claim up to outbox.batch_size pending rows of its share, in id order,
//      FOR UPDATE SKIP LOCKED, in a transaction, skipping parked rows and
//      the keys that still have records in flight;
//   2. hand them to the long-lived idempotent producer;
//   3. wait for this batch's delivery reports, at most outbox.batch_timeout;
//   4. set published_at on exactly the acknowledged rows (of this batch and
//      late ones of earlier batches), count a refusal on the failed ones
//      (parking them after outbox.max_attempts), and commit.
//
// Records still unreported after batch_timeout stay inside librdkafka,
// which keeps retrying them (message.timeout.ms is infinite by default);
// the transaction commits without them.  Their keys are skipped by later
// claims until they are reported, so a key's records never overtake each
// other, while other keys go on.  A slow or unreachable Kafka therefore
// never holds a transaction (nor the xmin horizon) open for longer than
// batch_timeout.  When too much is in flight (an outage), the worker stops
// claiming and only records late reports.
//
// The worker sleeps on one wait set: its latch (set by committing writers
// and by signals), the pipe librdkafka writes to when a delivery report or
// log line arrives, and postmaster death.
//
// Boundary: the Postgres-side functions below keep no C++ object with a
// destructor on the stack; everything C++ lives in the process-wide
// RelayState and is used through the noexcept Producer API, which reports
// errors by value.  An ERROR inside a turn is caught with PG_TRY, logged,
// the transaction aborted, and the loop goes on after a backoff.

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <memory>
#include <new>
#include <string>

#include "outbox/kafka/producer.h"

#include "outbox/pg.h"

#include "outbox/guc.h"
#include "outbox/outbox_queries.h"
#include "outbox/relay_worker.h"
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

using outbox::kafka::Producer;

// Everything the worker keeps between iterations.  Allocated once with
// new; never freed (the process exits), never on a Postgres stack frame.
struct RelayState {
    int index = 0;  // this worker's share: 0 .. outbox.workers-1
    char label[NAMEDATALEN + 32] = "";  // "pg outbox relay 1 [dbname]", for log lines
    const char *dbname = "";
    std::unique_ptr<Producer> producer;
    char *built_brokers = nullptr;  // settings the producer was built from
    char *built_config = nullptr;
    TimestampTz reconfigure_deadline = 0;  // settings changed while records were in flight
    int wake_pipe[2] = {-1, -1};
    WaitEventSet *wait_set = nullptr;
    TimestampTz next_claim_at = 0;  // backoff after failures
    TimestampTz quiet_until = 0;    // after an ERROR: do nothing until then
    int backoff_ms = 0;
    MemoryContext loop_context = nullptr;  // per-iteration allocations
    // The latch was set (a commit wrote a message, or a signal came) since
    // the last claim took its snapshot.  A wait inside a batch consumes the
    // latch; this remembers it, so such a commit is never left waiting for
    // the poll tick.
    bool woken = false;
    bool said_no_brokers = false;
    // Counts of this turn, for the shared stats slot.
    uint64 turn_acked = 0;
    uint64 turn_failed = 0;
    uint64 turn_parked = 0;
    char reported_error[256] = "";
    int reported_state = -1;
    bool said_no_extension = false;
    char last_connect_error[512] = "";
};

RelayState *relay = nullptr;

constexpr int kBackoffMinMs = 250;
// Records in flight beyond this many batches' worth stop new claims.
constexpr std::size_t kMaxBatchesInFlight = 4;
// Acknowledgements marked while the rest of the batch is still awaited.
constexpr std::size_t kMarkChunk = 200;
constexpr int kBackoffMaxMs = 30000;

// ---- C++ side: these never call Postgres and never throw ----

bool kafka_connect(const char *brokers, const char *extra, const char *client_id,
                   int batch_size, char *err, std::size_t errlen) noexcept {
    try {
        outbox::kafka::Settings s;
        s.brokers = brokers;
        s.extra = extra;
        s.client_id = client_id;
        s.batch_size = static_cast<std::size_t>(batch_size);
        std::string error;
        relay->producer = Producer::create(s, relay->wake_pipe[1], error);
        if (!relay->producer) snprintf(err, errlen, "%s", error.c_str());
        return relay->producer != nullptr;
    } catch (const std::exception &e) {
        snprintf(err, errlen, "%s", e.what());
        return false;
    }
}

// Flushes for up to flush_ms, then drops the producer; what it still held
// is abandoned (stays pending in the table).
void kafka_disconnect(int flush_ms) noexcept {
    if (relay && relay->producer) {
        relay->producer->shutdown(flush_ms);
        relay->producer.reset();
    }
}

// ---- Postgres side ----

char *keep_string(char *old, const char *value) {
    if (old) pfree(old);
    return MemoryContextStrdup(TopMemoryContext, value ? value : "");
}

// Sleeps until the latch is set, librdkafka has something for us,
// timeout_ms passes (-1: no timeout), or the postmaster dies (we exit).
void relay_wait(long timeout_ms) {
    if (outbox_worker_wait(relay->wait_set, relay->wake_pipe[0], timeout_ms)) relay->woken = true;
}

void emit_kafka_log() {
    Producer *p = relay->producer.get();
    if (!p) return;
    for (std::size_t i = 0; i < p->log_count(); i++) {
        int level = p->log_level(i) == outbox::kafka::LogLevel::Warning ? WARNING
                    : p->log_level(i) == outbox::kafka::LogLevel::Info  ? LOG
                                                                        : DEBUG1;
        ereport(level, (errmsg("%s: %s", relay->label, p->log_text(i))));
    }
    p->clear_log();
}

void backoff_after_failure() {
    relay->backoff_ms = relay->backoff_ms == 0 ? kBackoffMinMs
                                               : Min(relay->backoff_ms * 2, kBackoffMaxMs);
    relay->next_claim_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), relay->backoff_ms);
}

// The rows this transaction claimed (and holds locked), in id order.
struct ClaimedRows {
    const outbox::kafka::Record *records;
    const ItemPointerData *ctids;
    int n;
};

// Where row `id` of this claim is, or nullptr (the claim is in id order).
const ItemPointerData *claimed_ctid(const ClaimedRows &claimed, int64 id) {
    int lo = 0, hi = claimed.n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (claimed.records[mid].id == id) return &claimed.ctids[mid];
        if (claimed.records[mid].id < id)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return nullptr;
}

// Writes what the producer resolved (acks, failures) into the table.
// Inside a transaction with SPI connected.  Acknowledged rows of this
// transaction's claim (`claimed`, may be null) are marked by ctid, the
// others by id.  Returns how many were acknowledged.
std::size_t record_outcomes(const ClaimedRows *claimed) {
    Producer *p = relay->producer.get();
    std::size_t acked = p->acked_count();
    std::size_t failed = p->failed_count();
    if (acked > 0) {
        std::size_t batch_acked = p->batch_acked_count();
        int64 *by_id = static_cast<int64 *>(palloc(sizeof(int64) * acked));
        int n_by_id = 0;
        for (std::size_t i = 0; i < p->late_acked_count(); i++) by_id[n_by_id++] = p->late_acked_ids()[i];
        if (claimed && batch_acked > 0) {
            ItemPointerData *tids =
                static_cast<ItemPointerData *>(palloc(sizeof(ItemPointerData) * batch_acked));
            int n_tids = 0;
            for (std::size_t i = 0; i < batch_acked; i++) {
                int64 id = p->batch_acked_ids()[i];
                if (const ItemPointerData *t = claimed_ctid(*claimed, id))
                    ItemPointerCopy(t, &tids[n_tids++]);
                else
                    by_id[n_by_id++] = id;
            }
            outbox_mark_claimed_published(tids, n_tids);
        } else {
            for (std::size_t i = 0; i < batch_acked; i++) by_id[n_by_id++] = p->batch_acked_ids()[i];
        }
        outbox_mark_published(by_id, n_by_id);
        relay->backoff_ms = 0;
        relay->next_claim_at = 0;
    }
    if (failed > 0) {
        const char **errors = static_cast<const char **>(palloc(sizeof(char *) * failed));
        bool *permanent = static_cast<bool *>(palloc(sizeof(bool) * failed));
        for (std::size_t i = 0; i < failed; i++) {
            errors[i] = p->failed_error(i);
            permanent[i] = p->failed_permanent(i);
        }
        relay->turn_parked += outbox_record_failures(p->failed_ids(), errors, permanent,
                                                     static_cast<int>(failed), outbox_max_attempts);
    }
    relay->turn_acked += acked;
    relay->turn_failed += failed;
    p->clear_resolved();
    return acked;
}

// Publishes this turn's counts and the producer's state to the shared stats
// slot (outbox.worker_stats, outbox.stats).
void report_stats() {
    if (relay->turn_acked || relay->turn_failed || relay->turn_parked)
        outbox_stats_add(relay->turn_acked, relay->turn_failed, relay->turn_parked);
    relay->turn_acked = relay->turn_failed = relay->turn_parked = 0;
    Producer *p = relay->producer.get();
    if (!p) return;
    outbox_stats_set_in_flight(p->in_flight());
    int state = p->broker_state() == outbox::kafka::BrokerState::Up     ? OUTBOX_BROKER_UP
                : p->broker_state() == outbox::kafka::BrokerState::Down ? OUTBOX_BROKER_DOWN
                                                                        : OUTBOX_BROKER_UNKNOWN;
    if (state != relay->reported_state) {
        outbox_stats_set_broker_state(static_cast<OutboxBrokerState>(state));
        relay->reported_state = state;
    }
    if (p->last_error()[0] && strcmp(p->last_error(), relay->reported_error) != 0) {
        outbox_stats_error(p->last_error());
        strlcpy(relay->reported_error, p->last_error(), sizeof relay->reported_error);
    }
}

// Waits for the batch's delivery reports until `deadline`.  A shutdown
// request does not cut this short: the batch in flight is finished.
// Acknowledgements are marked as they arrive, in chunks, so that marking
// (the relay's biggest cost) overlaps the wait for the last ones.  Returns
// how many were acknowledged (and marked) here.
std::size_t await_deliveries(TimestampTz deadline, const ClaimedRows *claimed) {
    Producer *p = relay->producer.get();
    std::size_t acked = 0;
    p->poll();
    while (p->batch_in_flight() > 0) {
        if (p->acked_count() >= kMarkChunk) acked += record_outcomes(claimed);
        long left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);
        if (left <= 0) break;
        p->poll();
        if (p->batch_in_flight() == 0 || p->acked_count() >= kMarkChunk) continue;
        relay_wait(left);
        p->poll();
    }
    return acked;
}

// The keys with records in flight, as a text[] for the claim to skip.
Datum in_flight_keys() {
    Producer *p = relay->producer.get();
    int n = static_cast<int>(p->snapshot_in_flight_keys());
    const char **values = static_cast<const char **>(palloc(sizeof(char *) * (n > 0 ? n : 1)));
    std::size_t *lengths = static_cast<std::size_t *>(palloc(sizeof(std::size_t) * (n > 0 ? n : 1)));
    for (int i = 0; i < n; i++) {
        values[i] = p->in_flight_key(static_cast<std::size_t>(i)).data();
        lengths[i] = p->in_flight_key(static_cast<std::size_t>(i)).size();
    }
    return outbox_text_array(values, lengths, n);
}

// One batch: claim, produce, wait, mark, commit.  Returns the number of
// rows claimed (0: nothing pending, -1: the extension is not installed).
int run_batch() {
    int claimed = 0;
    relay->woken = false;  // commits after this point are not in our snapshot
    Producer *p = relay->producer.get();
    p->poll();  // late reports of earlier batches go into this transaction
    outbox_worker_begin("pg outbox: publishing a batch");
    if (!outbox_extension_ready()) {
        claimed = -1;
        p->clear_resolved();
    } else {
        // Late reports first: a row acknowledged but not yet marked would
        // otherwise look pending to the claim and go out twice.
        std::size_t acked = record_outcomes(nullptr);
        outbox::kafka::Record *records;
        ItemPointerData *ctids;
        claimed = outbox_claim_batch(outbox_batch_size, outbox_workers, relay->index,
                                     in_flight_keys(), &records, &ctids);
        ClaimedRows rows{records, ctids, claimed};
        if (claimed > 0) {
            p->produce(records, static_cast<std::size_t>(claimed));
            acked += await_deliveries(
                TimestampTzPlusMilliseconds(GetCurrentTimestamp(), outbox_batch_timeout_ms),
                &rows);
        }
        acked += record_outcomes(&rows);
        // Back off when a batch got nothing through: Kafka is down or
        // refusing.  The next acknowledgement ends the backoff.  Refused
        // rows next to acknowledged ones are retried after the shortest
        // backoff, not at the next poll tick.
        if (claimed > 0 && acked == 0)
            backoff_after_failure();
        else if (relay->turn_failed > 0)
            relay->next_claim_at =
                TimestampTzPlusMilliseconds(GetCurrentTimestamp(), kBackoffMinMs);
    }
    outbox_worker_commit(relay->loop_context);
    emit_kafka_log();
    report_stats();
    return claimed;
}

// Waits up to wait_ms for delivery reports (or the latch) and writes what
// came back in a short transaction.
void drain_step(long wait_ms) {
    Producer *p = relay->producer.get();
    p->poll();
    if (p->acked_count() == 0 && p->failed_count() == 0 && wait_ms > 0) {
        relay_wait(wait_ms);
        p->poll();
    }
    if (p->acked_count() > 0 || p->failed_count() > 0) {
        outbox_worker_begin("pg outbox: recording late deliveries");
        if (outbox_extension_ready())
            record_outcomes(nullptr);  // no rows locked here: all by id
        else
            p->clear_resolved();
        outbox_worker_commit(relay->loop_context);
    }
    emit_kafka_log();
    report_stats();
}

// Makes relay->producer match the current settings, if it can.  Returns
// false while the old producer is still finishing what it has in flight
// after a settings change: no new claims then.
bool ensure_producer() {
    const char *brokers = outbox_brokers ? outbox_brokers : "";
    const char *config = outbox_kafka_config ? outbox_kafka_config : "";
    Producer *p = relay->producer.get();

    if (p) {
        bool same = strcmp(brokers, relay->built_brokers) == 0 &&
                    strcmp(config, relay->built_config) == 0;
        if (same && !p->fatal()) {
            relay->reconfigure_deadline = 0;
            return true;
        }
        // Let what is in flight finish for a while; then abandon it (its
        // rows stay pending and go out through the new producer).
        if (p->in_flight() > 0) {
            TimestampTz now = GetCurrentTimestamp();
            if (relay->reconfigure_deadline == 0)
                relay->reconfigure_deadline =
                    TimestampTzPlusMilliseconds(now, outbox_batch_timeout_ms);
            if (now < relay->reconfigure_deadline && !p->fatal()) return false;
        }
        ereport(LOG, (errmsg("%s: Kafka settings changed, reconnecting", relay->label)));
        drain_step(0);  // record what already came back
        kafka_disconnect(0);
        relay->reconfigure_deadline = 0;
    }

    if (brokers[0] == '\0') {
        if (!relay->said_no_brokers)
            ereport(LOG, (errmsg("%s: outbox.brokers is empty; messages stay pending until it is "
                                 "set",
                                 relay->label)));
        relay->said_no_brokers = true;
        return true;
    }
    relay->said_no_brokers = false;

    char client_id[NAMEDATALEN + 32];
    snprintf(client_id, sizeof client_id, "pg_outbox-%s-%d", relay->dbname, relay->index + 1);
    char err[512];
    if (!kafka_connect(brokers, config, client_id, outbox_batch_size, err, sizeof err)) {
        if (strcmp(err, relay->last_connect_error) != 0)
            ereport(WARNING, (errmsg("%s: cannot create the Kafka producer: %s", relay->label,
                                     err)));
        strlcpy(relay->last_connect_error, err, sizeof relay->last_connect_error);
        backoff_after_failure();
        return true;
    }
    relay->last_connect_error[0] = '\0';
    relay->built_brokers = keep_string(relay->built_brokers, brokers);
    relay->built_config = keep_string(relay->built_config, config);
    ereport(LOG, (errmsg("%s: producing to %s", relay->label, brokers)));
    return true;
}

// Session settings of the relay that follow outbox.* settings.
void apply_session_settings() {
    // Off: the relay's commits (marks) do not wait for a WAL flush.  Safe:
    // a lost mark makes a duplicate, never a loss.  On: the server's own
    // synchronous_commit applies.
    if (!outbox_synchronous_commit)
        SetConfigOption("synchronous_commit", "off", PGC_SUSET, PGC_S_OVERRIDE);
    else
        SetConfigOption("synchronous_commit", nullptr, PGC_SUSET, PGC_S_OVERRIDE);
}

// One turn of the main loop.  May ereport(ERROR); the caller recovers.
void relay_iteration() {
    if (ConfigReloadPending) {
        ConfigReloadPending = false;
        ProcessConfigFile(PGC_SIGHUP);
        apply_session_settings();
    }

    if (relay->quiet_until > GetCurrentTimestamp()) {
        relay_wait(TimestampDifferenceMilliseconds(GetCurrentTimestamp(), relay->quiet_until));
        return;
    }

    bool may_claim = ensure_producer();
    Producer *p = relay->producer.get();
    TimestampTz now = GetCurrentTimestamp();

    if (!p) {
        relay_wait(relay->next_claim_at > now
                       ? TimestampDifferenceMilliseconds(now, relay->next_claim_at)
                       : outbox_poll_interval_ms);
        return;
    }
    // Backing off, or too much in flight: only record what comes back.
    std::size_t cap = static_cast<std::size_t>(outbox_batch_size) * kMaxBatchesInFlight;
    if (!may_claim) {
        drain_step(100);  // the old producer finishes its flights, or its time runs out
        return;
    }
    if (relay->next_claim_at > now || p->in_flight() >= cap) {
        long wait_ms = relay->next_claim_at > now
                           ? TimestampDifferenceMilliseconds(now, relay->next_claim_at)
                           : outbox_poll_interval_ms;
        drain_step(wait_ms);
        return;
    }

    int claimed = run_batch();
    if (claimed == -1) {
        if (!relay->said_no_extension)
            ereport(LOG, (errmsg("%s: waiting for CREATE EXTENSION outbox in database \"%s\"",
                                 relay->label, relay->dbname)));
        relay->said_no_extension = true;
    } else {
        relay->said_no_extension = false;
    }
    // A full batch means more may be waiting, and a wake-up during the batch
    // means a commit came after our snapshot: go again without sleeping.
    // Otherwise sleep until a commit, a delivery report, a retry is due, or
    // the poll tick.
    if (claimed < outbox_batch_size && !relay->woken) {
        long wait_ms = outbox_poll_interval_ms;
        TimestampTz after = GetCurrentTimestamp();
        if (relay->next_claim_at > after)
            wait_ms = Min(wait_ms, TimestampDifferenceMilliseconds(after, relay->next_claim_at));
        relay_wait(wait_ms);
    }
}

void relay_iteration_guarded() {
    PG_TRY();
    {
        relay_iteration();
    }
    PG_CATCH();
    {
        outbox_worker_recover(relay->loop_context);
        backoff_after_failure();
        relay->quiet_until = relay->next_claim_at;
    }
    PG_END_TRY();
}

// Before the process goes: whatever the producer still holds is dropped.
// Correctness never depends on this running (their rows are pending).
void relay_on_exit(int, Datum) { kafka_disconnect(0); }

// SIGTERM: give what is in flight a bounded time, record it, then go.
void relay_finish() {
    Producer *p = relay->producer.get();
    if (p) {
        TimestampTz deadline =
            TimestampTzPlusMilliseconds(GetCurrentTimestamp(), outbox_batch_timeout_ms);
        while (p->in_flight() > 0 && GetCurrentTimestamp() < deadline)
            drain_step(Min(TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline), 100L));
        drain_step(0);
    }
    kafka_disconnect(0);
}

}  // namespace

extern "C" void outbox_relay_main(Datum main_arg) {
    pqsignal(SIGHUP, SignalHandlerForConfigReload);
    pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
    BackgroundWorkerUnblockSignals();

    int slot = DatumGetInt32(main_arg);
    int database_index, share;
    outbox_relay_of_slot(slot, &database_index, &share);
    const char *dbname = outbox_database_name(database_index);
    BackgroundWorkerInitializeConnection(dbname, nullptr, 0);
    // The worker runs as a superuser: resolve nothing through a search
    // path that other roles could write to.
    SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_OVERRIDE);
    // A queue is read in index order, whatever the statistics say: a
    // backlog that arrived before autovacuum analysed the table must not
    // turn each claim into a sequential scan and a full sort.
    SetConfigOption("enable_seqscan", "off", PGC_SUSET, PGC_S_OVERRIDE);
    SetConfigOption("enable_bitmapscan", "off", PGC_SUSET, PGC_S_OVERRIDE);
    apply_session_settings();
    pgstat_report_appname("pg outbox relay");

    // nothrow: no C++ exception may unwind into Postgres code.
    relay = new (std::nothrow) RelayState();
    if (!relay) ereport(FATAL, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("out of memory")));
    relay->index = share;
    relay->dbname = dbname;
    snprintf(relay->label, sizeof relay->label, "pg outbox relay %d [%s]", share + 1, dbname);
    relay->built_brokers = keep_string(nullptr, "");
    relay->built_config = keep_string(nullptr, "");
    outbox_slot_attach(slot, OUTBOX_ROLE_RELAY, share, MyDatabaseId);

    outbox_worker_pipe(relay->wake_pipe, relay->label);
    relay->wait_set = outbox_worker_wait_set(relay->wake_pipe[0]);
    before_shmem_exit(relay_on_exit, 0);

    ereport(LOG, (errmsg("%s started (share %d of %d)", relay->label, share + 1, outbox_workers)));

    relay->loop_context = AllocSetContextCreate(TopMemoryContext, "pg outbox relay loop",
                                                ALLOCSET_DEFAULT_SIZES);
    while (!ShutdownRequestPending) {
        MemoryContextSwitchTo(relay->loop_context);
        relay_iteration_guarded();
        MemoryContextReset(relay->loop_context);
    }

    relay_finish();
    ereport(LOG, (errmsg("%s stopped", relay->label)));
    proc_exit(0);
}
