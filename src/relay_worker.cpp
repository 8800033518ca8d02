// The relay: publishes committed outbox rows to Kafka.
//
// One worker per share of the message keys (outbox.workers).  Each turn:
//
//   1. claim up to outbox.batch_size pending rows of its share, in id order,
//      FOR UPDATE SKIP LOCKED, from its low-water mark, skipping parked rows
//      and the keys that still have records in flight, and render them
//      within a byte budget;
//   2. hand them to the long-lived idempotent producer (never waiting for
//      room in its queue);
//   3. wait for this batch's delivery reports, at most outbox.batch_timeout,
//      marking acknowledgements as they arrive;
//   4. set published_at on exactly the acknowledged rows (of this batch and
//      late ones of earlier batches), count a refusal on the failed ones
//      (parking them after outbox.max_attempts), move the low-water mark up
//      to the first row still pending, and commit.
//
// Records still unreported after batch_timeout stay inside librdkafka,
// which keeps retrying them; the transaction commits without them.  Their
// keys are skipped by later claims until they are reported, so a key's
// records never overtake each other, while other keys go on.  A slow or
// unreachable Kafka therefore never holds a transaction (nor the xmin
// horizon) open for longer than batch_timeout.  When too much is in flight
// (an outage), the worker stops claiming and only records late reports.
//
// The low-water mark: the claim starts at it, so that it never walks the
// index entries of rows published long ago.  The mark is one unit
// (outbox/low_water.h); why no committed row is left below it:
// docs/architecture.md, "The low-water mark".
//
// Boundary: the Postgres-side functions below keep no C++ object with a
// destructor on the stack; everything C++ lives in the process-wide
// RelayState and is used through the noexcept Producer API, which reports
// errors by value.

#include <cstdio>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "outbox/common/progress.h"
#include "outbox/common/said_once.h"
#include "outbox/kafka/config.h"
#include "outbox/kafka/producer.h"
#include "outbox/kafka/progress_reader.h"

#include "outbox/guc.h"
#include "outbox/kafka_link.h"
#include "outbox/low_water.h"
#include "outbox/policy.h"
#include "outbox/queries/exactly_once.h"
#include "outbox/queries/relay.h"
#include "outbox/queries/spi.h"
#include "outbox/shmem.h"
#include "outbox/standby_wait.h"
#include "outbox/worker_common.h"
#include "outbox/workers.h"

#include <csignal>
#include <map>

extern "C" {
#include "access/xlog.h"
#include "miscadmin.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
}

namespace {

using outbox::kafka::Producer;
using outbox::kafka::report_error;

// The progress topic's last record of each of this database's ids.
struct Progress {
    std::map<std::string, std::map<int32_t, std::string>> last;  // id -> partition -> value
};

// Everything the worker keeps between turns.  Allocated once with nothrow
// new; never freed (the process exits), never on a Postgres stack frame.
struct RelayState {
    std::unique_ptr<Producer> producer;
    OutboxKafkaLink link;  // what the producer was built from; the secrets file
    TimestampTz reconfigure_deadline = 0;  // settings changed while records were in flight
    TimestampTz next_claim_at = 0;         // backoff after failures
    int backoff_ms = 0;
    outbox::low_water::Mark mark;  // every row below it is published, parked or waiting
    // Messages Kafka refused for good wait for their next attempt (schema
    // 1.3): whether any may wait, and when the next is due.
    bool waiting_known = false;
    bool waiting = true;
    TimestampTz next_due = 0;
    TimestampTz last_batch_end = 0;  // when the last batch that claimed something committed
    bool last_batch_full = false;
    double rate = 0;                 // messages per second under load, smoothed
    bool said_no_brokers = false;
    // Counts of this turn, for the shared stats slot.
    uint64 turn_acked = 0;
    uint64 turn_failed = 0;
    uint64 turn_parked = 0;
    uint64 turn_transient = 0;  // failures Kafka may not repeat (an outage), not refusals
    outbox::SaidOnce reported_error;
    // outbox.wait_for_standbys: the WAL position a claimed batch needed and
    // no standby reached within outbox.batch_timeout (0: none).  No claim
    // until they hold it.
    XLogRecPtr standby_need = 0;
    // outbox.delivery = exactly_once (docs/exactly-once.md): the producer is
    // transactional, with this share's id; no claim before recovery has
    // settled its last transaction (eos_ready).  `seq` is the last
    // transaction this database recorded.  Fenced (another producer took
    // the id) or diverged (Kafka holds transactions this database never
    // recorded): nothing is claimed until the settings change or the worker
    // restarts; `stopped_settings` are the settings it stopped under.
    bool eos = false;
    bool eos_ready = false;
    std::string tid_prefix;
    std::string tid;
    int64 seq = 0;
    char *stopped_settings = nullptr;
    outbox::SaidOnce said_eos;
    Progress progress;          // recovery's reading of the progress topic
    outbox::progress::Record txn;  // one transaction's record (recovery)
    bool eos_unknown = false;   // the last commit's outcome is open: replace the producer
    bool eos_fenced = false;    // fenced during this turn: stop after it
    TimestampTz last_commit_at = 0;  // of the last Kafka transaction
    char eos_error[1024] = {0};
    // What Kafka refused lately, per topic: such records are charged, not
    // put into a transaction, until their retry time (docs/exactly-once.md,
    // "What a refusal costs").  Outlives a replaced producer.
    outbox::kafka::TopicRefusals refusals;
    // Topics of a transaction whose failure no record could be charged
    // with: tried one per transaction, first one first, so that the one
    // Kafka refuses fails alone and is charged.  Rows of the others wait
    // (pending) meanwhile.
    std::vector<std::string> suspects;
    // The producer was replaced after a transaction known not to be
    // committed (eos_after_turn): its successor only registers the id; the
    // progress topic has nothing to settle.
    bool eos_light = false;
};

RelayState *state(OutboxWorker *w) { return static_cast<RelayState *>(w->state); }

// ---- C++ side: these never call Postgres and never throw ----

bool kafka_connect(RelayState *r, int wake_fd, const char *brokers, const char *extra,
                   const char *client_id, int batch_size, char *err, std::size_t errlen) noexcept {
    try {
        outbox::kafka::Settings s;
        s.client = {brokers, client_id, extra, r->link.secrets};
        s.batch_size = static_cast<std::size_t>(batch_size);
        if (r->eos) s.transactional_id = r->tid;
        std::string error;
        r->producer = Producer::create(s, wake_fd, error);
        if (r->producer) r->producer->set_refusals(&r->refusals);
        return r->producer || report_error(err, errlen, error);
    } catch (const std::exception &e) {
        return report_error(err, errlen, e.what());
    }
}

// Flushes for up to flush_ms, then drops the producer; what it still held
// is abandoned (stays pending in the table).
void kafka_disconnect(RelayState *r, int flush_ms) noexcept {
    if (r && r->producer) {
        r->producer->shutdown(flush_ms);
        r->producer.reset();
    }
}

// Exactly-once recovery, the Kafka steps.  Each blocks up to timeout_ms.

// Fences transactional id `tid` (a share of an earlier outbox.workers that
// did not stop cleanly): its open transaction ends, a commit it asked for
// completes, and no producer of it can commit any more.
bool fence_id(RelayState *r, const char *brokers, const char *extra, const char *tid,
              int timeout_ms, char *err, std::size_t errlen) noexcept {
    try {
        outbox::kafka::Settings s;
        s.client = {brokers, std::string(tid), extra, r->link.secrets};
        s.batch_size = 1;
        s.transactional_id = tid;
        std::string error;
        auto p = Producer::create(s, -1, error);
        if (!p) return report_error(err, errlen, error);
        bool fenced = false;
        if (p->init_transactions(timeout_ms, error, fenced)) return true;
        return report_error(err, errlen, error);
    } catch (const std::exception &e) {
        return report_error(err, errlen, e.what());
    }
}

bool read_progress(RelayState *r, Progress *out, const char *brokers, const char *extra,
                   const char *client_id, const char *topic, int timeout_ms, char *err,
                   std::size_t errlen) noexcept {
    try {
        outbox::kafka::ClientSettings c{brokers, std::string(client_id) + "-recovery", extra,
                                        r->link.secrets};
        std::string error;
        if (outbox::kafka::read_progress(c, topic, r->tid_prefix, timeout_ms, out->last, error))
            return true;
        return report_error(err, errlen, error);
    } catch (const std::exception &e) {
        return report_error(err, errlen, e.what());
    }
}

// What the progress topic says of `tid`: its last transaction (seq 0 when
// it has none); false with the reason when its record cannot be read.
bool progress_of(const Progress *p, const char *tid, outbox::progress::Record *out, char *err,
                 std::size_t errlen) noexcept {
    try {
        *out = outbox::progress::Record{};
        auto it = p->last.find(tid);
        if (it == p->last.end()) return true;
        // The last record of each partition the id's records are in (one,
        // unless partitions were added): the highest transaction counts.
        for (const auto &[partition, value] : it->second) {
            outbox::progress::Record rec;
            std::string error;
            if (!outbox::progress::decode(value, rec, error))
                return report_error(err, errlen, std::string(tid) + ": " + error);
            if (rec.seq > out->seq) *out = std::move(rec);
        }
        return true;
    } catch (const std::exception &e) {
        return report_error(err, errlen, e.what());
    }
}

// The progress record of transaction `seq` of the producer's open
// transaction, produced into it.
bool produce_progress(RelayState *r, const char *topic, int64 seq, char *err,
                      std::size_t errlen) noexcept {
    try {
        std::string error;
        if (r->producer->produce_progress(topic, r->tid,
                                          outbox::progress::encode(seq, r->producer->transaction_ids(),
                                                                  r->producer->transaction_digest()),
                                          error))
            return true;
        return report_error(err, errlen, error);
    } catch (const std::exception &e) {
        return report_error(err, errlen, e.what());
    }
}

// Begins a transaction and produces the claimed records into it, then
// their progress record (transaction `seq`).  0: produced; 1: nothing of
// the batch reached librdkafka (refused at once, or held): abort it; -1:
// failed, with the reason (abort it).
int txn_produce(RelayState *r, const outbox::kafka::Record *records, std::size_t n,
                const char *topic, int64 seq, char *err, std::size_t errlen) noexcept {
    try {
        Producer *p = r->producer.get();
        std::string error;
        if (!p->begin_transaction(error)) {
            report_error(err, errlen, error);
            return -1;
        }
        p->produce(records, n, outbox::policy::metadata_wait_ms(outbox_batch_timeout_ms));
        if (p->transaction_ids().empty()) return 1;
        return produce_progress(r, topic, seq, err, errlen) ? 0 : -1;
    } catch (const std::exception &e) {
        report_error(err, errlen, e.what());
        return -1;
    }
}

outbox::kafka::TxnOutcome txn_end(RelayState *r, bool commit, int timeout_ms, char *err,
                                  std::size_t errlen) noexcept {
    try {
        std::string error;
        auto o = commit ? r->producer->commit_transaction(timeout_ms, error)
                        : r->producer->abort_transaction(timeout_ms, error);
        if (!error.empty()) report_error(err, errlen, error);
        return o;
    } catch (const std::exception &e) {
        report_error(err, errlen, e.what());
        return outbox::kafka::TxnOutcome::Unknown;
    }
}

// Aborts a transaction whose acknowledgements did not all come back
// (txn_await), charging what caused it; `err` holds why and gets the rest.
outbox::kafka::TxnOutcome txn_abort_unacknowledged(RelayState *r, int timeout_ms, char *err,
                                                   std::size_t errlen) noexcept {
    try {
        std::string error = err;
        auto o = r->producer->abort_unacknowledged(timeout_ms, error);
        report_error(err, errlen, error);
        return o;
    } catch (const std::exception &e) {
        report_error(err, errlen, e.what());
        return outbox::kafka::TxnOutcome::Unknown;
    }
}

// Waits for the open transaction's acknowledgements; false with the
// reason when one did not come back with an offset.
bool txn_await(RelayState *r, int timeout_ms, char *err, std::size_t errlen) noexcept {
    try {
        std::string error;
        if (r->producer->await_transaction(timeout_ms, error)) return true;
        return report_error(err, errlen, error);
    } catch (const std::exception &e) {
        return report_error(err, errlen, e.what());
    }
}

bool txn_init(RelayState *r, int timeout_ms, bool *fenced, char *err, std::size_t errlen) noexcept {
    try {
        std::string error;
        if (r->producer->init_transactions(timeout_ms, error, *fenced)) return true;
        return report_error(err, errlen, error);
    } catch (const std::exception &e) {
        return report_error(err, errlen, e.what());
    }
}

void set_tids(RelayState *r, uint64 system_identifier, const char *dbname, OutboxShare share) noexcept {
    try {
        r->tid_prefix = outbox::progress::transactional_prefix(system_identifier, dbname);
        r->tid = outbox::progress::transactional_id(r->tid_prefix, share.index + 1, share.count);
    } catch (...) {
        r->tid_prefix.clear();
        r->tid.clear();
    }
}

// After a failed transaction that charged no record: its topics become
// suspects, each tried in a transaction of its own.  Returns how many.
std::size_t suspect_topics(RelayState *r) noexcept {
    try {
        if (r->producer && r->producer->last_txn_unattributed())
            r->suspects = r->producer->last_txn_topics();
    } catch (...) {
        r->suspects.clear();
    }
    return r->suspects.size();
}

// Isolating suspects: the claimed records of the first suspect topic that
// has any, copied to `out` (room for n).  Suspects without records in this
// claim are dropped.  Returns how many were copied; 0 when no suspect is
// left (produce the claim as it is).
std::size_t isolate_records(RelayState *r, const outbox::kafka::Record *in, std::size_t n,
                            outbox::kafka::Record *out) noexcept {
    while (!r->suspects.empty()) {
        const std::string &topic = r->suspects.front();
        std::size_t m = 0;
        for (std::size_t i = 0; i < n; i++)
            if (std::string_view(in[i].topic, in[i].topic_len) == topic) out[m++] = in[i];
        if (m > 0) return m;
        r->suspects.erase(r->suspects.begin());
    }
    return 0;
}

// The lone transaction of a suspect topic ended (committed, or charged):
// the next one is tried.
void suspect_done(RelayState *r) noexcept {
    if (!r->suspects.empty()) r->suspects.erase(r->suspects.begin());
}

void forget_progress(RelayState *r) noexcept {
    r->progress.last.clear();
    r->txn = outbox::progress::Record{};
}

// ---- Postgres side ----

void backoff_after_failure(RelayState *r) {
    r->backoff_ms = r->backoff_ms == 0 ? outbox::policy::kRelayBackoffMinMs
                                       : Min(r->backoff_ms * 2, outbox::policy::kRelayBackoffMaxMs);
    r->next_claim_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), r->backoff_ms);
}

long ms_until(TimestampTz t) {
    return Max(0L, TimestampDifferenceMilliseconds(GetCurrentTimestamp(), t));
}

// Where row `id` of this claim is, or nullptr (the claim is in id order).
const ItemPointerData *claimed_ctid(const OutboxClaim *claim, int64 id) {
    int lo = 0, hi = claim->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (claim->records[mid].id == id) return &claim->ctids[mid];
        if (claim->records[mid].id < id)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return nullptr;
}

// Marks the rows the producer acknowledged (not taken from its lists):
// acknowledged rows of this transaction's claim (`claim`, may be null) by
// ctid, the others by id, each with its record's partition and offset.
// Returns how many.
std::size_t mark_acked(OutboxWorker *w, const OutboxClaim *claim) {
    RelayState *r = state(w);
    Producer *p = r->producer.get();
    std::size_t acked = p->acked_count();
    if (acked == 0) return 0;
    // Schema 1.6 keeps each row's partition and offset; before, the
    // acknowledgement's time alone.
    bool places = w->schema >= kOutboxSchema16;
    std::size_t batch_acked = p->batch_acked_count();
    int64 *by_id = static_cast<int64 *>(palloc(sizeof(int64) * acked));
    int32 *by_id_part = static_cast<int32 *>(palloc(sizeof(int32) * acked));
    int64 *by_id_off = static_cast<int64 *>(palloc(sizeof(int64) * acked));
    int n_by_id = 0;
    for (std::size_t i = 0; i < p->late_acked_count(); i++, n_by_id++) {
        by_id[n_by_id] = p->late_acked_ids()[i];
        by_id_part[n_by_id] = p->late_acked_partitions()[i];
        by_id_off[n_by_id] = p->late_acked_offsets()[i];
    }
    ItemPointerData *tids =
        static_cast<ItemPointerData *>(palloc(sizeof(ItemPointerData) * (batch_acked + 1)));
    int32 *tid_part = static_cast<int32 *>(palloc(sizeof(int32) * (batch_acked + 1)));
    int64 *tid_off = static_cast<int64 *>(palloc(sizeof(int64) * (batch_acked + 1)));
    int n_tids = 0;
    for (std::size_t i = 0; i < batch_acked; i++) {
        int64 id = p->batch_acked_ids()[i];
        int32 part = p->batch_acked_partitions()[i];
        int64 off = p->batch_acked_offsets()[i];
        if (const ItemPointerData *t = claim ? claimed_ctid(claim, id) : nullptr) {
            ItemPointerCopy(t, &tids[n_tids]);
            tid_part[n_tids] = part;
            tid_off[n_tids++] = off;
        } else {
            by_id[n_by_id] = id;
            by_id_part[n_by_id] = part;
            by_id_off[n_by_id++] = off;
        }
    }
    OutboxPlaces claimed_at = {tid_part, tid_off}, by_id_at = {by_id_part, by_id_off};
    outbox_relay_mark_claimed(tids, places ? &claimed_at : nullptr, n_tids);
    outbox_relay_mark_by_id(by_id, places ? &by_id_at : nullptr, n_by_id);
    return acked;
}

// Writes what the producer resolved (acks, failures) into the table.
// Inside a transaction with SPI connected.  Returns how many were
// acknowledged.
std::size_t record_outcomes(OutboxWorker *w, const OutboxClaim *claim) {
    RelayState *r = state(w);
    Producer *p = r->producer.get();
    std::size_t acked = p->acked_count();
    std::size_t failed = p->failed_count();
    if (acked > 0) {
        mark_acked(w, claim);
        r->backoff_ms = 0;
        r->next_claim_at = 0;
    }
    if (failed > 0) {
        const char **errors = static_cast<const char **>(palloc(sizeof(char *) * failed));
        bool *permanent = static_cast<bool *>(palloc(sizeof(bool) * failed));
        bool *park_now = static_cast<bool *>(palloc(sizeof(bool) * failed));
        for (std::size_t i = 0; i < failed; i++) {
            errors[i] = p->failed_error(i);
            permanent[i] = p->failed_permanent(i);
            park_now[i] = p->failed_park_now(i);
            if (!permanent[i]) r->turn_transient++;
        }
        int64 first_parked = PG_INT64_MAX;
        TimestampTz due = r->waiting ? r->next_due : 0;
        r->turn_parked += outbox_relay_record_failures(
            w->schema, p->failed_ids(), errors, permanent, park_now, static_cast<int>(failed),
            outbox_max_attempts, w->label, &first_parked, &due);
        // A message that waits now keeps its key's later ones back; one
        // parked now lets them go, and the mark may have passed them.
        if (due != 0) {
            r->waiting = true;
            r->next_due = due;
        }
        r->mark.lower_to(first_parked);
    }
    r->turn_acked += acked;
    r->turn_failed += failed;
    p->clear_resolved();
    return acked;
}

// Messages that wait for a retry (schema 1.3): learns whether any does,
// and when one is due, moves the mark back to it (the mark passes those
// that wait, and the later messages of their keys).  Two probes of a small
// index, only at start and when a retry is due.
void refresh_waiting(OutboxWorker *w) {
    RelayState *r = state(w);
    if (w->schema < kOutboxSchema13) {
        r->waiting = false;
        r->waiting_known = false;
        return;
    }
    TimestampTz now = GetCurrentTimestamp();
    if (r->waiting_known && (!r->waiting || now < r->next_due)) return;
    r->next_due = outbox_relay_next_retry();
    r->waiting = r->next_due != 0;
    r->waiting_known = true;
    if (r->waiting && r->next_due <= now) {
        int64 due = outbox_relay_first_due();
        if (due >= 0) r->mark.lower_to(due);
    }
}

// Publishes this turn's counts and the producer's state to the shared stats
// slot (outbox.worker_stats, outbox.stats).
void report_stats(OutboxWorker *w) {
    RelayState *r = state(w);
    if (r->turn_acked || r->turn_failed || r->turn_parked)
        outbox_stats_add(r->turn_acked, r->turn_failed, r->turn_parked);
    r->turn_acked = r->turn_failed = r->turn_parked = r->turn_transient = 0;
    Producer *p = r->producer.get();
    if (!p) return;
    outbox_stats_set_in_flight(p->in_flight());
    outbox_link_show_state(&r->link, p->broker_state());
    if (p->last_error()[0] && r->reported_error.first_time(p->last_error()))
        outbox_stats_error(p->last_error());
}

void after_turn(OutboxWorker *w) {
    RelayState *r = state(w);
    if (Producer *p = r->producer.get()) {
        outbox_worker_emit_log_lines(w, p->log());
        p->clear_log();
    }
    report_stats(w);
}

// Waits for the batch's delivery reports until `deadline`.  A shutdown
// request does not cut this short: the batch in flight is finished (it is
// bounded by outbox.batch_timeout).  Acknowledgements are marked as they
// arrive, in chunks, so that marking (the relay's biggest cost) overlaps the
// wait for the last ones.  Returns how many were acknowledged here.
std::size_t await_deliveries(OutboxWorker *w, TimestampTz deadline, const OutboxClaim *claim) {
    Producer *p = state(w)->producer.get();
    std::size_t acked = 0;
    p->poll();
    while (p->batch_in_flight() > 0) {
        if (p->acked_count() >= outbox::policy::kMarkChunk) acked += record_outcomes(w, claim);
        long left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);
        if (left <= 0) break;
        p->poll();
        if (p->batch_in_flight() == 0 || p->acked_count() >= outbox::policy::kMarkChunk) continue;
        // Acknowledgements arrive through the pipe; commits meanwhile are
        // noted, not woken for (the next claim takes them).
        outbox_worker_wait_kafka(w, left);
        p->poll();
    }
    return acked;
}

// Publishing waits for the standbys (outbox.wait_for_standbys): says so
// once in the log, and what for in outbox.worker_stats at every check.
void note_standby_wait(OutboxWorker *w, const char *why) {
    if (state(w)->standby_need == 0)
        ereport(LOG, (errmsg("%s: publishing waits for the standbys: %s", w->label, why),
                      errhint("outbox.wait_for_standbys names them; nothing is lost meanwhile")));
    outbox_stats_waiting(why);
}

void note_standby_back(OutboxWorker *w) {
    ereport(LOG, (errmsg("%s: the standbys hold the waiting batch's WAL; publishing again",
                         w->label)));
    outbox_stats_waiting(nullptr);
    state(w)->standby_need = 0;
}

// Holds a claimed batch until the standbys outbox.wait_for_standbys names
// have its WAL, so that no failover can leave Kafka with a message the
// promoted server lacks.  Every row the claim took committed before its
// snapshot; the WAL up to outbox_batch_wal_end() holds their commits.  Waits
// in steps of 1 ms for a healthy standby's round trip, then longer ones (no
// walsender wakes us), at most outbox.batch_timeout;
// false when they still lack it: the batch is not produced, and no claim
// is made until they have it (relay_turn).
bool await_standbys(OutboxWorker *w) {
    if (!outbox_standbys_required()) return true;
    XLogRecPtr need = outbox_batch_wal_end();
    TimestampTz deadline =
        TimestampTzPlusMilliseconds(GetCurrentTimestamp(), outbox_batch_timeout_ms);
    TimestampTz start = GetCurrentTimestamp();
    char why[256];
    while (!outbox_standbys_hold(need, why, sizeof why)) {
        TimestampTz now = GetCurrentTimestamp();
        long left = TimestampDifferenceMilliseconds(now, deadline);
        if (left <= 0) {
            note_standby_wait(w, why);
            state(w)->standby_need = need;
            return false;
        }
        bool fresh = TimestampDifferenceMilliseconds(start, now) < outbox::policy::kStandbyFastPollMs;
        outbox_worker_wait_kafka(w, Min(fresh ? 1L : outbox::policy::kStandbyPollMaxMs, left));
    }
    return true;
}

// Sleeps `ms` (a few) without waking for each commit that sets the latch
// meanwhile: under load every commit would wake us, and a wake-up costs
// more than the message it brings.  The latch stays set: the claim sees
// those commits.
void gather(long ms) {
    if (ms > 0) pg_usleep(ms * 1000L);
}

// ---- exactly once (outbox.delivery = exactly_once; docs/exactly-once.md) ----

// Tests only (outbox.fault_point): dies here as kill -9 would.
void fault_point(OutboxWorker *w, const char *step) {
    if (outbox_fault_point && strcmp(outbox_fault_point, step) == 0) {
        ereport(LOG, (errmsg("%s: fault point \"%s\": killing myself", w->label, step)));
        kill(MyProcPid, SIGKILL);
        pg_usleep(10L * 1000 * 1000);
    }
}

// Fenced, or Kafka holds transactions this database never recorded: the
// relay claims nothing until its settings change or it restarts.  Outside
// a transaction.
void eos_stop(OutboxWorker *w, const char *why) {
    RelayState *r = state(w);
    ereport(WARNING, (errmsg("%s: stops publishing: %s", w->label, why),
                      errhint("Nothing is lost: messages stay pending. A restart of this worker "
                              "(pg_terminate_backend) or a change of its Kafka settings tries "
                              "again; see docs/exactly-once.md.")));
    outbox_stats_error(why);
    outbox_stats_waiting(why);
    r->stopped_settings = outbox_keep_string(r->stopped_settings, r->link.built ? r->link.built : "");
    kafka_disconnect(r, 0);
    r->eos_ready = false;
    r->eos_light = false;
    forget_progress(r);
}

// Recovery failed for a passing reason: say it (once per distinct text),
// try again after a backoff.
void eos_retry_later(OutboxWorker *w, const char *what, const char *err) {
    RelayState *r = state(w);
    char text[1200];
    snprintf(text, sizeof text, "exactly-once recovery: %s: %s", what, err);
    if (r->said_eos.first_time(text))
        ereport(WARNING, (errmsg("%s: %s", w->label, text),
                          errhint("Nothing is published until it succeeds; it is tried again.")));
    outbox_stats_error(text);
    backoff_after_failure(r);
    forget_progress(r);
}

// Whether the progress topic's record of `tid`, which this database last
// recorded at `pg_seq`, can be settled: false (the reason in r->eos_error)
// when it cannot be read, or when Kafka holds transactions of it this
// database never recorded.
bool eos_check(OutboxWorker *w, const char *tid, int64 pg_seq, bool clean) {
    RelayState *r = state(w);
    if (!progress_of(&r->progress, tid, &r->txn, r->eos_error, sizeof r->eos_error))
        return false;
    int64 kafka_seq = r->txn.seq;
    if (kafka_seq < pg_seq && !clean) {
        // The relay did not stop cleanly and the topic lacks what this
        // database recorded: the record of a later transaction may be
        // missing too, and its rows would go out twice.
        snprintf(r->eos_error, sizeof r->eos_error,
                 "outbox.progress_topic holds transaction %lld of %s, this database recorded "
                 "%lld and its relay did not stop cleanly: was the topic changed or emptied? "
                 "Set it back; or accept that the last transaction may go out again with "
                 "UPDATE outbox.relay_transaction SET clean = true WHERE transactional_id = "
                 "'%s'",
                 static_cast<long long>(kafka_seq), tid, static_cast<long long>(pg_seq), tid);
        return false;
    }
    if (kafka_seq == pg_seq + 1 && r->txn.has_digest) {
        // The transaction to settle must have carried this database's rows
        // of those ids: a copy of it that wrote rows of its own (a split
        // brain) has other messages under the same ids, which Kafka never
        // saw.
        int found = 0;
        uint64 digest = outbox_txn_rows_digest(r->txn.ids.data(),
                                               static_cast<int>(r->txn.ids.size()), &found);
        if (digest != r->txn.digest) {
            snprintf(r->eos_error, sizeof r->eos_error,
                     "Kafka committed transaction %lld of %s with other messages than this "
                     "database's rows of its %zu ids (%d of them here): another server with "
                     "this database's identity wrote and published after this one's state was "
                     "taken (a split brain), or those rows were deleted. Nothing was marked. "
                     "If this database is the one to keep, accept that its own rows of those "
                     "ids go out with UPDATE outbox.relay_transaction SET seq = %lld WHERE "
                     "transactional_id = '%s'",
                     static_cast<long long>(kafka_seq), tid, r->txn.ids.size(), found,
                     static_cast<long long>(kafka_seq), tid);
            return false;
        }
    }
    if (kafka_seq <= pg_seq + 1) return true;
    snprintf(r->eos_error, sizeof r->eos_error,
             "Kafka holds transaction %lld of %s, this database recorded only up to %lld: "
             "another server with this database's identity published after it (a base "
             "backup started beside it, or a standby promoted without "
             "outbox.wait_for_standbys)",
             static_cast<long long>(kafka_seq), tid, static_cast<long long>(pg_seq));
    return false;
}

// Settles `tid` (checked by eos_check): the rows of a transaction Kafka
// committed and this database did not record are marked published.
// Returns the seq to go on from.
int64 eos_settle(OutboxWorker *w, const char *tid, int64 pg_seq) {
    RelayState *r = state(w);
    if (!progress_of(&r->progress, tid, &r->txn, r->eos_error, sizeof r->eos_error))
        ereport(ERROR, (errmsg("pg outbox: %s", r->eos_error)));
    int64 kafka_seq = r->txn.seq;
    if (kafka_seq == pg_seq + 1) {
        // Where Kafka wrote them is not known here (the progress record
        // names ids only): published_at alone is set.
        outbox_relay_mark_by_id(r->txn.ids.data(), nullptr, static_cast<int>(r->txn.ids.size()));
        ereport(LOG, (errmsg("%s: Kafka committed transaction %lld of %s, which this database "
                             "had not recorded: its %zu messages are marked published",
                             w->label, static_cast<long long>(kafka_seq), tid, r->txn.ids.size())));
        return kafka_seq;
    }
    if (kafka_seq < pg_seq)
        ereport(WARNING, (errmsg("%s: outbox.progress_topic holds transaction %lld of %s, this "
                                 "database recorded %lld: a new or emptied topic; going on",
                                 w->label, static_cast<long long>(kafka_seq), tid,
                                 static_cast<long long>(pg_seq))));
    return pg_seq;
}

// Before the first claim of a transactional producer: fences the shares of
// an earlier outbox.workers that did not stop cleanly, registers this
// share's id (which ends its own earlier transaction), reads the progress
// topic read_committed and marks the rows of a transaction Kafka committed
// and this database did not record.  True when the relay may claim.
bool eos_recover(OutboxWorker *w) {
    RelayState *r = state(w);
    const char *brokers = outbox_brokers ? outbox_brokers : "";
    const char *config = outbox_kafka_config ? outbox_kafka_config : "";
    int timeout = Max(outbox_batch_timeout_ms, outbox::policy::kEosRecoveryTimeoutMs);
    char err[1024];
    if (r->eos_light) {
        // Nothing is open but what the new registration ends: the last
        // transaction was not committed, and this database recorded the one
        // before (r->seq); stale shares were fenced by the first recovery.
        r->eos_light = false;
        bool fenced = false;
        if (txn_init(r, timeout, &fenced, err, sizeof err)) {
            r->eos_ready = true;
            return true;
        }
        if (fenced) {
            eos_stop(w, err);
            return false;
        }
        eos_retry_later(w, "registering the transactional id", err);
        return false;
    }
    if (!outbox_worker_begin(w, "pg outbox: exactly-once recovery")) return false;
    if (w->schema < kOutboxSchema15) {
        outbox_worker_commit(w);
        eos_retry_later(w, "schema", "outbox.delivery = exactly_once needs the extension's "
                                     "schema 1.5: run ALTER EXTENSION outbox UPDATE");
        return false;
    }
    int n = w->share.count;
    const char **current = static_cast<const char **>(palloc(sizeof(char *) * n));
    for (int i = 0; i < n; i++)
        current[i] = psprintf("%s%dof%d", r->tid_prefix.c_str(), i + 1, n);
    char **stale;
    int64 *stale_seq;
    int n_stale = outbox_txn_lock_stale(r->tid_prefix.c_str(), current, n, &stale, &stale_seq);
    for (int i = 0; i < n_stale; i++) {
        if (!fence_id(r, brokers, config, stale[i], timeout, err, sizeof err)) {
            outbox_worker_commit(w);
            eos_retry_later(w, "fencing an earlier share", err);
            return false;
        }
    }
    bool fenced = false;
    if (!txn_init(r, timeout, &fenced, err, sizeof err)) {
        outbox_worker_commit(w);
        if (fenced)
            eos_stop(w, err);
        else
            eos_retry_later(w, "registering the transactional id", err);
        return false;
    }
    if (!read_progress(r, &r->progress, brokers, config, r->tid.c_str(),
                       outbox_progress_topic ? outbox_progress_topic : "", timeout, err,
                       sizeof err)) {
        outbox_worker_commit(w);
        eos_retry_later(w, "reading the progress", err);
        return false;
    }
    bool clean;
    int64 pg_seq = outbox_txn_lock(r->tid.c_str(), &clean);
    // Every id first: when Kafka is ahead of this database for any, nothing
    // is marked.
    bool ok = eos_check(w, r->tid.c_str(), pg_seq, clean);
    for (int i = 0; ok && i < n_stale; i++) ok = eos_check(w, stale[i], stale_seq[i], false);
    if (!ok) {
        outbox_worker_commit(w);
        eos_stop(w, r->eos_error);
        return false;
    }
    int64 next = eos_settle(w, r->tid.c_str(), pg_seq);
    outbox_txn_set(r->tid.c_str(), next, false);
    for (int i = 0; i < n_stale; i++)
        outbox_txn_set(stale[i], eos_settle(w, stale[i], stale_seq[i]), true);
    outbox_worker_commit(w);
    forget_progress(r);
    r->seq = next;
    r->eos_ready = true;
    r->said_eos.forget();
    outbox_stats_waiting(nullptr);
    ereport(LOG, (errmsg("%s: publishing exactly once as transactional id %s, from transaction "
                         "%lld", w->label, r->tid.c_str(), static_cast<long long>(next + 1))));
    return true;
}

// Marks the rows of the open Kafka transaction's records (claimed by this
// turn: by ctid) and records it as transaction `seq`.  Returns how many.
std::size_t mark_transaction(OutboxWorker *w, const OutboxClaim *claim, int64 seq) {
    RelayState *r = state(w);
    std::size_t n = mark_acked(w, claim);
    outbox_txn_set(r->tid.c_str(), seq, false);
    return n;
}

// Publishes a claim as one Kafka transaction with its progress record, and
// marks its rows in the caller's transaction, kept only if Kafka commits.
// Returns how many rows were acknowledged.
std::size_t publish_transaction(OutboxWorker *w, const OutboxClaim *claim) {
    RelayState *r = state(w);
    int64 seq = r->seq + 1;
    char err[1024];
    err[0] = '\0';
    // Let the coordinator finish the last commit's markers before this
    // transaction registers its partitions (policy.h); the claim has
    // already taken part of that time.
    if (r->last_commit_at > 0) {
        long since = TimestampDifferenceMilliseconds(r->last_commit_at, GetCurrentTimestamp());
        if (since < outbox::policy::kTxnSettleMs) gather(outbox::policy::kTxnSettleMs - since);
    }
    // Isolating the topics of a failure no record was charged with: this
    // transaction holds one of them only; the other rows stay pending.
    const outbox::kafka::Record *records = claim->records;
    std::size_t n = static_cast<std::size_t>(claim->n);
    bool isolating = false;
    if (!r->suspects.empty()) {
        outbox::kafka::Record *lone =
            static_cast<outbox::kafka::Record *>(palloc(sizeof(outbox::kafka::Record) * n));
        std::size_t m = isolate_records(r, records, n, lone);
        if (m > 0) {
            records = lone;
            n = m;
            isolating = true;
        }
    }
    int produced = txn_produce(r, records, n, outbox_progress_topic ? outbox_progress_topic : "",
                               seq, err, sizeof err);
    using outbox::kafka::TxnOutcome;
    TxnOutcome o;
    std::size_t marked = 0;
    if (produced == 0) {
        fault_point(w, "before_commit");
        // Every record's acknowledgement first: a row is marked only with
        // the offset Kafka gave its record (one that came back without
        // aborts the transaction, and the row goes again).  Then the rows
        // are marked in a subtransaction that only Kafka's commit keeps,
        // before the commit is asked for.  Whatever happens, nothing is
        // visible before this transaction commits, after Kafka's.
        if (txn_await(r, outbox_batch_timeout_ms, err, sizeof err)) {
            OutboxSubtransaction sub = outbox_subtransaction_begin();
            marked = mark_transaction(w, claim, seq);
            fault_point(w, "during_mark");
            o = txn_end(r, true, outbox_batch_timeout_ms, err, sizeof err);
            outbox_subtransaction_end(&sub, o == TxnOutcome::Committed);
        } else {
            o = txn_abort_unacknowledged(r, outbox_batch_timeout_ms, err, sizeof err);
        }
    } else {
        char abort_err[512];
        abort_err[0] = '\0';
        o = txn_end(r, false, outbox_batch_timeout_ms, abort_err, sizeof abort_err);
        if (!err[0]) strlcpy(err, abort_err, sizeof err);
    }
    if (isolating && o != TxnOutcome::Fenced) suspect_done(r);
    switch (o) {
        case TxnOutcome::Committed: {
            r->last_commit_at = GetCurrentTimestamp();
            fault_point(w, "after_commit");
            r->seq = seq;
            // Marked already: only the counts (refusals are recorded by
            // the caller).
            r->producer->forget_batch_acked();
            r->turn_acked += marked;
            r->backoff_ms = 0;
            r->next_claim_at = 0;
            return marked;
        }
        case TxnOutcome::Aborted:
            if (!isolating && suspect_topics(r) > 0) {
                // Kafka refused something and said not what: its topics
                // go one per transaction, at once (no backoff).
                ereport(LOG, (errmsg("%s: Kafka transaction %lld failed without naming a record "
                                     "(%s): its %zu topics are tried one per transaction",
                                     w->label, static_cast<long long>(seq), err,
                                     r->suspects.size())));
            } else if (err[0] && r->producer->failed_count() == 0) {
                // Not a record's refusal (those are failures, recorded by
                // the caller): the progress topic, the coordinator.
                outbox_stats_error(err);
                if (r->said_eos.first_time(err))
                    ereport(WARNING, (errmsg("%s: a Kafka transaction was aborted: %s", w->label,
                                             err)));
                backoff_after_failure(r);
            }
            return 0;
        case TxnOutcome::Fenced:
            strlcpy(r->eos_error, err, sizeof r->eos_error);
            r->eos_fenced = true;
            return 0;
        case TxnOutcome::Unknown:
        default:
            ereport(LOG, (errmsg("%s: the outcome of Kafka transaction %lld is not known (%s); "
                                 "it is settled before the next claim",
                                 w->label, static_cast<long long>(seq), err)));
            r->eos_unknown = true;
            if (!isolating) suspect_topics(r);
            return 0;
    }
}

// After the turn's commit: a fenced producer stops the relay; one whose
// last transaction's outcome is open is replaced (recovery settles it).
void eos_after_turn(OutboxWorker *w) {
    RelayState *r = state(w);
    if (r->eos_fenced) {
        r->eos_fenced = false;
        r->eos_unknown = false;
        char why[1200];
        snprintf(why, sizeof why,
                 "fenced: another producer took transactional id %s (%s)", r->tid.c_str(),
                 r->eos_error);
        eos_stop(w, why);
    } else if (r->eos_unknown) {
        r->eos_unknown = false;
        kafka_disconnect(r, 0);
        r->eos_ready = false;
        backoff_after_failure(r);
    } else if (r->producer && r->producer->fatal()) {
        // A transaction known not to be committed left the producer unable
        // to go on (librdkafka 2.0.2 after a topic Kafka would not add):
        // replaced at once, its records charged already.
        kafka_disconnect(r, 0);
        r->eos_ready = false;
        r->eos_light = true;
    }
}

// The keys with records in flight, as a text[] for the claim to skip.
Datum in_flight_keys(Producer *p) {
    int n = static_cast<int>(p->snapshot_in_flight_keys());
    const char **values = static_cast<const char **>(palloc(sizeof(char *) * (n > 0 ? n : 1)));
    std::size_t *lengths =
        static_cast<std::size_t *>(palloc(sizeof(std::size_t) * (n > 0 ? n : 1)));
    for (int i = 0; i < n; i++) {
        values[i] = p->in_flight_key(static_cast<std::size_t>(i)).data();
        lengths[i] = p->in_flight_key(static_cast<std::size_t>(i)).size();
    }
    return outbox_text_array(values, lengths, n);
}

// One batch: claim, produce, wait, mark, commit.  Returns the number of
// rows claimed (0: nothing pending, -1: the extension is not ready here).
int run_batch(OutboxWorker *w) {
    RelayState *r = state(w);
    Producer *p = r->producer.get();
    w->woken = false;  // commits after this point are in our snapshot
    p->poll();         // late reports of earlier batches go into this transaction
    if (!outbox_worker_begin(w, "pg outbox: publishing a batch")) {
        p->clear_resolved();
        return -1;
    }
    outbox_low_water_start_turn(&r->mark);
    refresh_waiting(w);
    // Late reports first: a row acknowledged but not yet marked would
    // otherwise look pending to the claim and go out twice.
    std::size_t acked = record_outcomes(w, nullptr);
    OutboxClaim claim;
    outbox_relay_claim(w->schema, outbox_batch_size, r->mark.value(), w->share,
                       in_flight_keys(p), r->waiting, outbox::policy::kBatchByteBudget, &claim);
    bool held = claim.n > 0 && !await_standbys(w);
    if (claim.n > 0 && !held && r->eos) {
        acked += publish_transaction(w, &claim);
    } else if (claim.n > 0 && !held) {
        // One deadline for the batch: asking about new topics spends of it.
        TimestampTz deadline =
            TimestampTzPlusMilliseconds(GetCurrentTimestamp(), outbox_batch_timeout_ms);
        p->produce(claim.records, static_cast<std::size_t>(claim.n),
                   outbox::policy::metadata_wait_ms(outbox_batch_timeout_ms));
        acked += await_deliveries(w, deadline, &claim);
    }
    acked += record_outcomes(w, &claim);
    outbox_low_water_end_turn(&r->mark, w->schema, r->waiting);
    // Back off when a batch got nothing through because Kafka is down: no
    // acknowledgement, and a failure that is not a refusal (or no report at
    // all).  The next acknowledgement ends the backoff.  A batch Kafka only
    // refused is no outage: its rows wait (or are parked) and the next claim
    // goes on at once with the others.  Rows that failed for a passing reason
    // next to acknowledged ones are retried after the shortest backoff, not
    // at the next poll tick.
    bool refusals_only = r->turn_failed > 0 && r->turn_transient == 0;
    // A batch held for the standbys is no outage either: relay_turn waits
    // for them.
    if (held)
        r->next_claim_at = 0;
    else if (claim.n > 0 && acked == 0 && !refusals_only)
        backoff_after_failure(r);
    else if (r->turn_transient > 0)
        r->next_claim_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
                                                       outbox::policy::kRelayBackoffMinMs);
    outbox_worker_commit(w);
    after_turn(w);
    if (r->eos) eos_after_turn(w);
    if (held) return 0;
    // A batch the budget cut short is as good as a full one: more waits.
    return claim.left > 0 ? outbox_batch_size : claim.n;
}

// Waits up to wait_ms for delivery reports (or the latch) and writes what
// came back in a short transaction.
void drain_step(OutboxWorker *w, long wait_ms) {
    Producer *p = state(w)->producer.get();
    p->poll();
    if (p->acked_count() == 0 && p->failed_count() == 0 && wait_ms > 0) {
        outbox_worker_wait(w, wait_ms);
        p->poll();
    }
    if (p->acked_count() > 0 || p->failed_count() > 0) {
        if (outbox_worker_begin(w, "pg outbox: recording late deliveries")) {
            record_outcomes(w, nullptr);  // no rows locked here: all by id
            outbox_worker_commit(w);
        } else {
            p->clear_resolved();
        }
    }
    after_turn(w);
}

// Makes the producer match the current settings, if it can.  Returns false
// while the old producer is still finishing what it has in flight after a
// settings change: no new claims then.
bool ensure_producer(OutboxWorker *w) {
    RelayState *r = state(w);
    const char *brokers = outbox_brokers ? outbox_brokers : "";
    const char *config = outbox_kafka_config ? outbox_kafka_config : "";
    Producer *p = r->producer.get();
    bool eos = outbox_delivery == OUTBOX_DELIVERY_EXACTLY_ONCE;
    const char *parts[] = {brokers, config, eos ? "exactly_once" : "at_least_once",
                           eos && outbox_progress_topic ? outbox_progress_topic : ""};
    char *settings = outbox_link_settings(parts, 4);

    // Stopped (fenced, or Kafka ahead of this database): not again under
    // the same settings.
    if (r->stopped_settings) {
        if (strcmp(r->stopped_settings, settings) == 0 && !p) return true;
        pfree(r->stopped_settings);
        r->stopped_settings = nullptr;
        outbox_stats_waiting(nullptr);
    }

    if (p) {
        if (outbox_link_matches(&r->link, settings, p->secrets()) && !p->fatal()) {
            r->reconfigure_deadline = 0;
            return true;
        }
        // Let what is in flight finish for a while; then abandon it (its
        // rows stay pending and go out through the new producer).
        // Into exactly once: what the idempotent producer has in flight is
        // waited for, however long (abandoned, it would go out twice).
        if (p->in_flight() > 0 && eos && !r->eos && !p->fatal()) return false;
        if (p->in_flight() > 0) {
            TimestampTz now = GetCurrentTimestamp();
            if (r->reconfigure_deadline == 0)
                r->reconfigure_deadline = TimestampTzPlusMilliseconds(now, outbox_batch_timeout_ms);
            if (now < r->reconfigure_deadline && !p->fatal()) return false;
        }
        ereport(LOG, (errmsg("%s: Kafka settings changed, reconnecting", w->label)));
        r->eos_light = false;
        drain_step(w, 0);  // record what already came back
        kafka_disconnect(r, 0);
        r->reconfigure_deadline = 0;
    }

    if (brokers[0] == '\0') {
        if (!r->said_no_brokers)
            ereport(LOG, (errmsg("%s: outbox.brokers is empty; messages stay pending until it is "
                                 "set",
                                 w->label)));
        r->said_no_brokers = true;
        return true;
    }
    r->said_no_brokers = false;
    if (!r->link.secrets_ok) {
        backoff_after_failure(r);
        return true;
    }

    char client_id[NAMEDATALEN + 32];
    snprintf(client_id, sizeof client_id, "pg_outbox-%s-%d", w->dbname, w->share.index + 1);
    r->eos = eos;
    r->eos_ready = false;
    if (eos && r->tid.empty()) set_tids(r, GetSystemIdentifier(), w->dbname, w->share);
    char err[512];
    if (!kafka_connect(r, w->wake_pipe[1], brokers, config, client_id, outbox_batch_size, err,
                       sizeof err)) {
        outbox_link_connect_failed(w, &r->link, "producer", err);
        backoff_after_failure(r);
        return true;
    }
    outbox_link_connected(&r->link, settings);
    ereport(LOG, (errmsg("%s: producing to %s", w->label, brokers)));
    return true;
}

// Settings that follow outbox.* settings: the relay's commit durability
// and the secrets file.
void relay_reload(OutboxWorker *w) {
    RelayState *r = state(w);
    // Off: the relay's commits (marks) do not wait for a WAL flush.  Safe:
    // a lost mark makes a duplicate, never a loss.  On: the server's own
    // synchronous_commit applies.  Exactly once: always on, whatever the
    // server says; a crash must not lose the record of a transaction Kafka
    // committed, or recovery would find Kafka more than one ahead.
    const char *sync = outbox_delivery == OUTBOX_DELIVERY_EXACTLY_ONCE ? "on"
                       : outbox_synchronous_commit                     ? nullptr
                                                                       : "off";
    SetConfigOption("synchronous_commit", sync, PGC_SUSET, PGC_S_SESSION);
    outbox_link_reload(w, &r->link, "published");
}

// Before the process goes (also after an ERROR): whatever the producer
// still holds is dropped.  Correctness never depends on this running.
void relay_on_exit(int, Datum arg) {
    kafka_disconnect(reinterpret_cast<RelayState *>(DatumGetPointer(arg)), 0);
}

void relay_start(OutboxWorker *w) {
    RelayState *r = outbox_worker_new_state<RelayState>(w);
    relay_reload(w);
    before_shmem_exit(relay_on_exit, PointerGetDatum(r));
}

// How long to let commits gather at `rate` messages per second.
long linger_for(double rate) {
    long ms = static_cast<long>(rate / outbox::policy::kLingerPerMsMessagesPerSecond);
    return Max(0L, Min(static_cast<long>(outbox_linger_ms), ms));
}

long relay_turn(OutboxWorker *w) {
    RelayState *r = state(w);
    bool may_claim = ensure_producer(w);
    Producer *p = r->producer.get();
    TimestampTz now = GetCurrentTimestamp();
    if (!p) return r->next_claim_at > now ? ms_until(r->next_claim_at) : outbox_poll_interval_ms;
    if (!may_claim) {
        drain_step(w, 100);  // the old producer finishes its flights, or its time runs out
        return 0;
    }
    if (r->eos && !r->eos_ready) {
        if (r->next_claim_at > now) return ms_until(r->next_claim_at);
        if (!eos_recover(w)) {
            after_turn(w);
            return r->next_claim_at > 0 ? ms_until(r->next_claim_at) : outbox_poll_interval_ms;
        }
        after_turn(w);
        p = r->producer.get();
    }
    // Backing off, or too much in flight: only record what comes back.
    std::size_t cap = static_cast<std::size_t>(outbox_batch_size) * outbox::policy::kMaxBatchesInFlight;
    if (r->next_claim_at > now || p->in_flight() >= cap) {
        drain_step(w, r->next_claim_at > now ? ms_until(r->next_claim_at) : outbox_poll_interval_ms);
        return 0;
    }
    // A batch waited for the standbys in vain: no claim until they hold its
    // WAL (or the setting no longer names them).  Late reports are still
    // recorded meanwhile.
    if (r->standby_need != 0) {
        char why[256];
        if (!outbox_standbys_hold(r->standby_need, why, sizeof why)) {
            outbox_stats_waiting(why);
            drain_step(w, outbox::policy::kStandbyPollMaxMs);
            return 0;
        }
        note_standby_back(w);
    }
    // Under load (a commit woke us right after a batch), let more commits
    // gather before claiming: each batch has a fixed cost (a transaction, a
    // Kafka request and its acknowledgement, a WAL flush) that would
    // otherwise be paid for a message or two, on the cores the writers
    // need.  The more messages arrive, the longer the wait (up to
    // outbox.linger): a quiet server publishes each commit at once.
    // (Not after a full batch: more is waiting already.)
    bool busy = r->last_batch_end > 0 && !r->last_batch_full &&
                TimestampDifferenceMilliseconds(r->last_batch_end, now) < outbox::policy::kBusyWindowMs;
    if (busy) gather(linger_for(r->rate));
    int claimed = run_batch(w);
    if (claimed < 0) return outbox_poll_interval_ms;
    TimestampTz ended = GetCurrentTimestamp();
    if (claimed > 0 && busy) {
        double seconds = Max(1e-4, (ended - r->last_batch_end) / 1e6);
        r->rate = 0.7 * r->rate + 0.3 * (claimed / seconds);
    } else if (!busy) {
        r->rate = 0;
    }
    r->last_batch_end = claimed > 0 ? ended : 0;
    r->last_batch_full = claimed >= outbox_batch_size;
    // A full batch means more may be waiting, and a wake-up during the batch
    // means a commit came after our snapshot: go again without sleeping.
    // Otherwise sleep until a commit, a delivery report, a retry is due (of
    // the batch, or of a message Kafka refused), or the poll tick.
    if (claimed >= outbox_batch_size || w->woken) return 0;
    long wait = outbox_poll_interval_ms;
    if (r->next_claim_at > 0) wait = Min(wait, ms_until(r->next_claim_at));
    if (r->waiting && r->next_due > 0) wait = Min(wait, ms_until(r->next_due));
    return Max(wait, 1L);
}

// SIGTERM: give what is in flight a bounded time, record it, then go.
void relay_stop(OutboxWorker *w) {
    RelayState *r = state(w);
    if (Producer *p = r->producer.get()) {
        TimestampTz deadline =
            TimestampTzPlusMilliseconds(GetCurrentTimestamp(), outbox_batch_timeout_ms);
        while (p->in_flight() > 0 && GetCurrentTimestamp() < deadline)
            drain_step(w, Min(ms_until(deadline), 100L));
        drain_step(w, 0);
    }
    // A clean stop: nothing of this transactional id is open or unrecorded.
    if (r->eos && r->eos_ready && r->producer &&
        outbox_worker_begin(w, "pg outbox: stopping")) {
        if (w->schema >= kOutboxSchema15) outbox_txn_set(r->tid.c_str(), r->seq, true);
        outbox_worker_commit(w);
    }
    kafka_disconnect(r, 0);
}

const OutboxWorkerKind kRelay = {
    OUTBOX_ROLE_RELAY,
    OutboxOnSigterm::kFinishTurn,
    OutboxKafka::kPipe,
    OutboxPlanner::kIndexOrder,
    kOutboxSchema10,
    relay_start,
    relay_turn,
    relay_reload,
    relay_stop,
};

}  // namespace

void outbox_relay_main(Datum main_arg) { outbox_worker_main(&kRelay, main_arg); }
