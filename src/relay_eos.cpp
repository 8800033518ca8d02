// The relay's exactly-once delivery (outbox.delivery = exactly_once;
// docs/exactly-once.md): each claim is one Kafka transaction with its
// progress record, its rows marked in a subtransaction that only Kafka's
// commit keeps; before the first claim, recovery fences earlier shares,
// registers this share's transactional id and settles what Kafka committed
// and this database did not record.  The claim, the marks and the worker's
// turn are relay_worker.cpp's (outbox/relay_state.h).
//
// Boundary: the C++ side below never calls Postgres and never throws; the
// Postgres side keeps no C++ object with a destructor on the stack.

#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include "outbox/common/progress.h"
#include "outbox/kafka/config.h"
#include "outbox/kafka/producer.h"
#include "outbox/kafka/progress_reader.h"

#include "outbox/guc.h"
#include "outbox/policy.h"
#include "outbox/queries/exactly_once.h"
#include "outbox/queries/relay.h"
#include "outbox/queries/spi.h"
#include "outbox/relay_state.h"
#include "outbox/shmem.h"
#include "outbox/worker_common.h"
#include "outbox/workers.h"

#include <csignal>

extern "C" {
#include "miscadmin.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
}

namespace outbox::relay {

void set_tids(RelayState *r, uint64 system_identifier, const char *dbname, OutboxShare share) noexcept {
    try {
        r->tid_prefix = outbox::progress::transactional_prefix(system_identifier, dbname);
        r->tid = outbox::progress::transactional_id(r->tid_prefix, share.index + 1, share.count);
    } catch (...) {
        r->tid_prefix.clear();
        r->tid.clear();
    }
}

}  // namespace outbox::relay

namespace {

using namespace outbox::relay;
using outbox::kafka::report_error;

// ---- C++ side: these never call Postgres and never throw ----

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

// The progress topic's last record of each id starting with `prefix`.
bool read_progress(RelayState *r, Progress *out, const char *brokers, const char *extra,
                   const char *client_id, const char *topic, const char *prefix, int timeout_ms,
                   char *err, std::size_t errlen) noexcept {
    try {
        outbox::kafka::ClientSettings c{brokers, std::string(client_id) + "-recovery", extra,
                                        r->link.secrets};
        std::string error;
        if (outbox::kafka::read_progress(c, topic, prefix, timeout_ms, out->last, error))
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

// A transactional id of another system identifier whose relay did not stop
// cleanly: this cluster was made by pg_upgrade from a server that crashed
// and was started again without its brokers (its relay never settled its
// last transaction), or restored from a copy of a server that may still
// run.  It is not fenced (that server may run elsewhere, and a fence would
// stop it).  When Kafka committed exactly one transaction of it after what
// this database recorded, with this database's rows of those ids (the
// progress record's digest), those rows are marked published: under the
// new ids they would go out twice.  Otherwise nothing is marked.  Either
// way the id is settled (clean) and not looked at again.  A transaction it
// left open is not aborted here: Kafka aborts it after its
// transaction.timeout.ms, and read_committed consumers of its partitions
// wait until then (docs/operations.md).
void eos_settle_foreign(OutboxWorker *w, const char *tid, int64 pg_seq) {
    RelayState *r = state(w);
    if (!progress_of(&r->progress, tid, &r->txn, r->eos_error, sizeof r->eos_error)) {
        ereport(WARNING, (errmsg("%s: transactional id %s of another system identifier is not "
                                 "settled: %s", w->label, tid, r->eos_error)));
        outbox_txn_set(tid, pg_seq, true);
        return;
    }
    int64 kafka_seq = r->txn.seq;
    if (kafka_seq == pg_seq + 1 && r->txn.has_digest) {
        int found = 0;
        uint64 digest = outbox_txn_rows_digest(r->txn.ids.data(),
                                               static_cast<int>(r->txn.ids.size()), &found);
        if (digest == r->txn.digest) {
            outbox_relay_mark_by_id(r->txn.ids.data(), nullptr, static_cast<int>(r->txn.ids.size()));
            ereport(LOG, (errmsg("%s: Kafka committed transaction %lld of %s (another system "
                                 "identifier: a pg_upgrade or a restore), which this database had "
                                 "not recorded: its %zu messages are marked published",
                                 w->label, static_cast<long long>(kafka_seq), tid,
                                 r->txn.ids.size())));
            outbox_txn_set(tid, kafka_seq, true);
            return;
        }
    }
    if (kafka_seq > pg_seq)
        ereport(LOG, (errmsg("%s: Kafka holds transaction %lld of %s (another system identifier), "
                             "this database recorded %lld with other rows or fewer: that server "
                             "went on elsewhere; nothing of it is marked here",
                             w->label, static_cast<long long>(kafka_seq), tid,
                             static_cast<long long>(pg_seq))));
    outbox_txn_set(tid, pg_seq, true);
}

// Marks the rows of the open Kafka transaction's records (claimed by this
// turn: by ctid) and records it as transaction `seq`.  Returns how many.
std::size_t mark_transaction(OutboxWorker *w, const OutboxClaim *claim, int64 seq) {
    RelayState *r = state(w);
    std::size_t n = mark_acked(w, claim);
    outbox_txn_set(r->tid.c_str(), seq, false);
    return n;
}

}  // namespace

namespace outbox::relay {

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
    // Ids of another system identifier that did not stop cleanly (this
    // cluster was made by pg_upgrade, or restored from another server's
    // copy): their progress is read too (eos_settle_foreign).
    char **foreign;
    int64 *foreign_seq;
    int n_foreign = outbox_txn_lock_foreign(r->tid_prefix.c_str(), &foreign, &foreign_seq);
    if (!read_progress(r, &r->progress, brokers, config, r->tid.c_str(),
                       outbox_progress_topic ? outbox_progress_topic : "",
                       n_foreign > 0 ? "pg_outbox-" : r->tid_prefix.c_str(), timeout, err,
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
    for (int i = 0; i < n_foreign; i++) eos_settle_foreign(w, foreign[i], foreign_seq[i]);
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

}  // namespace outbox::relay
