#include "outbox/shmem.h"

#include "outbox/guc.h"

extern "C" {
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "storage/shmem.h"
}

namespace {

// A relay worker's slot.  Written only by its worker; read without a lock
// by committing backends, which at worst set a stale latch (a spurious
// wake-up of whatever process now owns that PGPROC: harmless).
struct RelaySlot {
    volatile pid_t pid;  // 0: free
    volatile Oid database;
    Latch *volatile latch;
};

struct OutboxShared {
    int nslots;
    RelaySlot slots[FLEXIBLE_ARRAY_MEMBER];
};

OutboxShared *shared = nullptr;
int my_slot = -1;
shmem_request_hook_type prev_shmem_request_hook = nullptr;
shmem_startup_hook_type prev_shmem_startup_hook = nullptr;

int slot_count() { return outbox_workers; }

Size shared_size() {
    return add_size(offsetof(OutboxShared, slots), mul_size(sizeof(RelaySlot), slot_count()));
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
        shared->nslots = slot_count();
    }
    LWLockRelease(AddinShmemInitLock);
}

void detach_slot(int, Datum) {
    if (shared && my_slot >= 0) {
        shared->slots[my_slot].pid = 0;
        pg_write_barrier();
        shared->slots[my_slot].latch = nullptr;
        my_slot = -1;
    }
}

}  // namespace

void outbox_shmem_init(void) {
    prev_shmem_request_hook = shmem_request_hook;
    shmem_request_hook = request_shmem;
    prev_shmem_startup_hook = shmem_startup_hook;
    shmem_startup_hook = startup_shmem;
}

void outbox_relay_slot_attach(int index, Oid database) {
    if (!shared || index < 0 || index >= shared->nslots)
        elog(FATAL, "pg outbox: no shared memory slot %d for this relay worker", index);
    RelaySlot &s = shared->slots[index];
    s.latch = &MyProc->procLatch;
    s.database = database;
    pg_write_barrier();
    s.pid = MyProcPid;
    my_slot = index;
    on_shmem_exit(detach_slot, 0);
}

void outbox_wake_relays(Oid database) {
    if (!shared) return;
    for (int i = 0; i < shared->nslots; i++) {
        RelaySlot &s = shared->slots[i];
        if (s.pid == 0 || s.database != database) continue;
        pg_read_barrier();
        Latch *latch = s.latch;
        if (latch) SetLatch(latch);
    }
}
