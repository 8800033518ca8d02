#include "outbox/shmem.h"

#include "outbox/low_water.h"

#include "outbox/guc.h"
#include "outbox/policy.h"

extern "C" {
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "storage/spin.h"
}

namespace {

constexpr int kMinuteBuckets = 60;

// A worker's slot.  Identity fields are written only by its worker and read
// without a lock by committing backends, which at worst set a stale latch (a
// spurious wake-up of whatever process now owns that PGPROC: harmless).
// Counters are under `mutex`, taken once per batch by the worker and once
// per stats query by a reader.
struct WorkerSlot {
    volatile pid_t pid;  // 0: free
    volatile Oid database;
    volatile int role;
    Latch *volatile latch;

    slock_t mutex;
    int share;
    TimestampTz started_at;
    TimestampTz last_activity_at;
    uint64 processed;
    uint64 failed;
    uint64 parked;
    uint64 batches;
    uint64 in_flight;
    int broker_state;
    TimestampTz last_error_at;
    char last_error[256];
    char waiting_for[256];  // what publishing waits for ("": nothing)
    // processed per second over the last minute: second stamp and count
    int64 bucket_second[kMinuteBuckets];
    uint64 bucket_count[kMinuteBuckets];
    // Relays: the low-water mark, and the lowest rescan point asked of it
    // (outbox/low_water.h).
    pg_atomic_uint64 low_water;
    pg_atomic_uint64 rescan_from;
    // Inbox handlers: the records of the handler call in progress.  Written
    // and read only by the slot's worker, one process after another: attach
    // and detach leave it, so that the next process finds a call that
    // ended its predecessor.
    int call_n;  // 0: no call in progress
    bool call_timed_out;
    char call_error[256];
    char call_topic[256];  // a Kafka topic name has at most 249 characters
    pg_uuid_t call_ids[outbox::policy::kMaxHandlerBatch];
};

struct OutboxShared {
    int nslots;
    WorkerSlot slots[FLEXIBLE_ARRAY_MEMBER];
};

OutboxShared *shared = nullptr;
WorkerSlot *my_slot = nullptr;
shmem_request_hook_type prev_shmem_request_hook = nullptr;
shmem_startup_hook_type prev_shmem_startup_hook = nullptr;

Size shared_size() {
    return add_size(offsetof(OutboxShared, slots),
                    mul_size(sizeof(WorkerSlot), outbox_slot_count()));
}

void request_shmem() {
    if (prev_shmem_request_hook) prev_shmem_request_hook();
    RequestAddinShmemSpace(shared_size());
}

void startup_shmem() {
    if (prev_shmem_startup_hook) prev_shmem_startup_hook();
    LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
    bool found;
    shared = static_cast<OutboxShared *>(ShmemInitStruct("pg outbox", shared_size(), &found));
    if (!found) {
        memset(shared, 0, shared_size());
        shared->nslots = outbox_slot_count();
        for (int i = 0; i < shared->nslots; i++) {
            SpinLockInit(&shared->slots[i].mutex);
            pg_atomic_init_u64(&shared->slots[i].low_water, 0);
            pg_atomic_init_u64(&shared->slots[i].rescan_from, PG_UINT64_MAX);
        }
    }
    LWLockRelease(AddinShmemInitLock);
}

void detach_slot(int, Datum) {
    if (my_slot) {
        my_slot->pid = 0;
        pg_write_barrier();
        my_slot->latch = nullptr;
        my_slot = nullptr;
    }
}

int64 unix_second(TimestampTz t) {
    return t / USECS_PER_SEC + (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY;
}

}  // namespace

void outbox_shmem_init(void) {
    prev_shmem_request_hook = shmem_request_hook;
    shmem_request_hook = request_shmem;
    prev_shmem_startup_hook = shmem_startup_hook;
    shmem_startup_hook = startup_shmem;
}

void outbox_slot_attach(int index, OutboxWorkerRole role, int share, Oid database) {
    if (!shared || index < 0 || index >= shared->nslots)
        elog(FATAL, "pg outbox: no shared memory slot %d for this worker", index);
    WorkerSlot &s = shared->slots[index];
    SpinLockAcquire(&s.mutex);
    s.share = share;
    s.started_at = GetCurrentTimestamp();
    s.last_activity_at = 0;
    s.processed = s.failed = s.parked = s.batches = s.in_flight = 0;
    s.broker_state = OUTBOX_BROKER_UNKNOWN;
    s.last_error_at = 0;
    s.last_error[0] = '\0';
    s.waiting_for[0] = '\0';
    memset(s.bucket_second, 0, sizeof s.bucket_second);
    memset(s.bucket_count, 0, sizeof s.bucket_count);
    SpinLockRelease(&s.mutex);
    pg_atomic_write_u64(&s.low_water, 0);
    pg_atomic_write_u64(&s.rescan_from, PG_UINT64_MAX);
    s.latch = &MyProc->procLatch;
    s.database = database;
    s.role = role;
    pg_write_barrier();
    s.pid = MyProcPid;
    my_slot = &s;
    on_shmem_exit(detach_slot, 0);
}

void outbox_wake(OutboxWorkerRole role, Oid database) {
    if (!shared) return;
    for (int i = 0; i < shared->nslots; i++) {
        WorkerSlot &s = shared->slots[i];
        if (s.pid == 0 || s.role != role || s.database != database) continue;
        pg_read_barrier();
        Latch *latch = s.latch;
        if (latch) SetLatch(latch);
    }
}

void outbox_stats_add(uint64 processed, uint64 failed, uint64 parked) {
    if (!my_slot) return;
    TimestampTz now = GetCurrentTimestamp();
    int64 second = unix_second(now);
    int b = static_cast<int>(second % kMinuteBuckets);
    SpinLockAcquire(&my_slot->mutex);
    my_slot->processed += processed;
    my_slot->failed += failed;
    my_slot->parked += parked;
    my_slot->batches++;
    my_slot->last_activity_at = now;
    if (my_slot->bucket_second[b] != second) {
        my_slot->bucket_second[b] = second;
        my_slot->bucket_count[b] = 0;
    }
    my_slot->bucket_count[b] += processed;
    SpinLockRelease(&my_slot->mutex);
}

void outbox_stats_set_in_flight(uint64 in_flight) {
    if (!my_slot) return;
    SpinLockAcquire(&my_slot->mutex);
    my_slot->in_flight = in_flight;
    SpinLockRelease(&my_slot->mutex);
}

void outbox_stats_set_broker_state(OutboxBrokerState state) {
    if (!my_slot) return;
    SpinLockAcquire(&my_slot->mutex);
    my_slot->broker_state = state;
    SpinLockRelease(&my_slot->mutex);
}

void outbox_stats_error(const char *text) {
    if (!my_slot) return;
    TimestampTz now = GetCurrentTimestamp();
    SpinLockAcquire(&my_slot->mutex);
    strlcpy(my_slot->last_error, text, sizeof my_slot->last_error);
    my_slot->last_error_at = now;
    SpinLockRelease(&my_slot->mutex);
}

void outbox_stats_waiting(const char *text) {
    if (!my_slot) return;
    SpinLockAcquire(&my_slot->mutex);
    strlcpy(my_slot->waiting_for, text ? text : "", sizeof my_slot->waiting_for);
    SpinLockRelease(&my_slot->mutex);
}

bool outbox_slot_stats(int index, OutboxSlotStats *out) {
    if (!shared || index < 0 || index >= shared->nslots) return false;
    WorkerSlot &s = shared->slots[index];
    pid_t pid = s.pid;
    if (pid == 0) return false;
    pg_read_barrier();
    int64 now_second = unix_second(GetCurrentTimestamp());
    out->pid = pid;
    out->role = s.role;
    out->database = s.database;
    SpinLockAcquire(&s.mutex);
    out->share = s.share;
    out->started_at = s.started_at;
    out->last_activity_at = s.last_activity_at;
    out->processed = s.processed;
    out->failed = s.failed;
    out->parked = s.parked;
    out->batches = s.batches;
    out->in_flight = s.in_flight;
    out->broker_state = s.broker_state;
    out->last_error_at = s.last_error_at;
    memcpy(out->last_error, s.last_error, sizeof out->last_error);
    memcpy(out->waiting_for, s.waiting_for, sizeof out->waiting_for);
    uint64 minute = 0;
    for (int b = 0; b < kMinuteBuckets; b++)
        if (s.bucket_second[b] > now_second - kMinuteBuckets) minute += s.bucket_count[b];
    SpinLockRelease(&s.mutex);
    out->processed_last_minute = minute;
    return true;
}

void outbox_relays_lower_rescan(Oid database, int64 id, bool wake) {
    if (!shared) return;
    for (int i = 0; i < shared->nslots; i++) {
        WorkerSlot &s = shared->slots[i];
        if (s.pid == 0 || s.role != OUTBOX_ROLE_RELAY || s.database != database) continue;
        uint64 want = static_cast<uint64>(Max(id, 0));
        uint64 old = pg_atomic_read_u64(&s.rescan_from);
        while (want < old && !pg_atomic_compare_exchange_u64(&s.rescan_from, &old, want)) {
        }
        if (!wake) continue;
        if (Latch *latch = s.latch) SetLatch(latch);
    }
}

int64 outbox_relay_take_rescan(void) {
    if (!my_slot) return PG_INT64_MAX;
    uint64 v = pg_atomic_exchange_u64(&my_slot->rescan_from, PG_UINT64_MAX);
    return v == PG_UINT64_MAX ? PG_INT64_MAX : static_cast<int64>(v);
}

void outbox_relay_set_low_water(int64 low_water) {
    if (my_slot) pg_atomic_write_u64(&my_slot->low_water, static_cast<uint64>(Max(low_water, 0)));
}

int64 outbox_relays_lowest_low_water(Oid database) {
    int64 lowest = PG_INT64_MAX;
    if (!shared) return lowest;
    for (int i = 0; i < shared->nslots; i++) {
        WorkerSlot &s = shared->slots[i];
        if (s.pid == 0 || s.role != OUTBOX_ROLE_RELAY || s.database != database) continue;
        lowest = Min(lowest, static_cast<int64>(pg_atomic_read_u64(&s.low_water)));
    }
    return lowest;
}

void outbox_call_begin(const char *topic, const Datum *event_ids, int n) {
    if (!my_slot) return;
    strlcpy(my_slot->call_topic, topic, sizeof my_slot->call_topic);
    n = Min(n, static_cast<int>(lengthof(my_slot->call_ids)));
    for (int i = 0; i < n; i++) my_slot->call_ids[i] = *DatumGetUUIDP(event_ids[i]);
    my_slot->call_timed_out = false;
    my_slot->call_error[0] = '\0';
    pg_write_barrier();
    my_slot->call_n = n;
}

void outbox_call_end(void) {
    if (my_slot) my_slot->call_n = 0;
}

void outbox_call_note_end(const char *text, bool timed_out) {
    if (!my_slot || my_slot->call_n == 0 || my_slot->call_timed_out) return;
    if (timed_out) my_slot->call_timed_out = true;
    if (text) strlcpy(my_slot->call_error, text, sizeof my_slot->call_error);
}

void outbox_call_forget_unless_timed_out(void) {
    if (my_slot && !my_slot->call_timed_out) my_slot->call_n = 0;
}

int outbox_call_take_unfinished(char **topic, pg_uuid_t **ids, char *error, std::size_t len,
                                bool *timed_out) {
    if (!my_slot || my_slot->call_n <= 0) return 0;
    int n = my_slot->call_n;
    *topic = pstrdup(my_slot->call_topic);
    *ids = static_cast<pg_uuid_t *>(palloc(sizeof(pg_uuid_t) * n));
    memcpy(*ids, my_slot->call_ids, sizeof(pg_uuid_t) * n);
    strlcpy(error, my_slot->call_error, len);
    *timed_out = my_slot->call_timed_out;
    my_slot->call_n = 0;
    return n;
}
