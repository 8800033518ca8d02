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
// That is at-least-once delivery.  With outbox.delivery = exactly_once,
// steps 2-4 are one Kafka transaction per claim instead (relay_eos.cpp,
// through the four functions outbox/relay_state.h declares); the claim, the
// marks, the low-water mark and the worker's turn are this file's, shared.
//
// Boundary: the Postgres-side functions below keep no C++ object with a
// destructor on the stack; everything C++ lives in the process-wide
// RelayState (outbox/relay_state.h) and is used through the noexcept
// Producer API, which reports errors by value.

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

#include "outbox/guc.h"
#include "outbox/relay_state.h"
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

using namespace outbox::relay;
using outbox::kafka::report_error;

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

// ---- Postgres side ----

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
    else if (claim.n == 0 && acked == 0 && r->backoff_ms > 0 && p->in_flight() > 0)
        // Still no acknowledgement since a batch got nothing through, and
        // nothing new to send (the keys pending all have a record waiting in
        // the producer): back off further, not claim at every commit that
        // wakes us or every few milliseconds.  A scan of the whole backlog
        // each time cost a core while Kafka was down.  An acknowledgement
        // ends the backoff at once.
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
    // The backoff time (if any) has passed and this claim acts on it: kept,
    // it would make every later wait 1 ms, a claim in a loop.  What the
    // batch sets anew is this turn's.
    r->next_claim_at = 0;
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

namespace outbox::relay {

void kafka_disconnect(RelayState *r, int flush_ms) noexcept {
    if (r && r->producer) {
        r->producer->shutdown(flush_ms);
        r->producer.reset();
    }
}

void backoff_after_failure(RelayState *r) {
    r->backoff_ms = r->backoff_ms == 0 ? outbox::policy::kRelayBackoffMinMs
                                       : Min(r->backoff_ms * 2, outbox::policy::kRelayBackoffMaxMs);
    r->next_claim_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), r->backoff_ms);
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

// Sleeps `ms` (a few) without waking for each commit that sets the latch
// meanwhile: under load every commit would wake us, and a wake-up costs
// more than the message it brings.  The latch stays set: the claim sees
// those commits.
void gather(long ms) {
    if (ms > 0) pg_usleep(ms * 1000L);
}

}  // namespace outbox::relay

void outbox_relay_main(Datum main_arg) { outbox_worker_main(&kRelay, main_arg); }
