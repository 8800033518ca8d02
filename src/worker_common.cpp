#include "outbox/worker_common.h"

#include <fcntl.h>
#include <unistd.h>

#include "outbox/shmem.h"

extern "C" {
#include "access/xact.h"
#include "utils/resowner.h"
#include "executor/spi.h"
#include "pgstat.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"
}

void outbox_worker_begin(const char *activity) {
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    SPI_connect();
    PushActiveSnapshot(GetTransactionSnapshot());
    pgstat_report_activity(STATE_RUNNING, activity);
}

void outbox_worker_commit(MemoryContext context) {
    SPI_finish();
    PopActiveSnapshot();
    CommitTransactionCommand();
    MemoryContextSwitchTo(context);
    pgstat_report_stat(false);
    pgstat_report_activity(STATE_IDLE, nullptr);
}

void outbox_worker_recover(MemoryContext context) {
    HOLD_INTERRUPTS();
    MemoryContextSwitchTo(context);
    ErrorData *edata = CopyErrorData();
    outbox_stats_error(edata->message);
    FreeErrorData(edata);
    EmitErrorReport();
    AbortCurrentTransaction();
    FlushErrorState();
    MemoryContextSwitchTo(context);
    pgstat_report_activity(STATE_IDLE, nullptr);
    RESUME_INTERRUPTS();
}

bool outbox_worker_subtransaction(void (*fn)(void *), void *arg, char **error) {
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
        // Aborting the subtransaction also restores the user id it began
        // with, should fn have switched it.
        MemoryContextSwitchTo(cxt);
        ErrorData *edata = CopyErrorData();
        FlushErrorState();
        RollbackAndReleaseCurrentSubTransaction();
        MemoryContextSwitchTo(cxt);
        CurrentResourceOwner = owner;
        *error = pstrdup(edata->message);
        FreeErrorData(edata);
        ok = false;
    }
    PG_END_TRY();
    return ok;
}

WaitEventSet *outbox_worker_wait_set(int pipe_fd) {
#if PG_VERSION_NUM >= 170000
    WaitEventSet *set = CreateWaitEventSet(nullptr, 3);
#else
    WaitEventSet *set = CreateWaitEventSet(TopMemoryContext, 3);
#endif
    AddWaitEventToSet(set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, nullptr);
    AddWaitEventToSet(set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, nullptr, nullptr);
    if (pipe_fd >= 0) AddWaitEventToSet(set, WL_SOCKET_READABLE, pipe_fd, nullptr, nullptr);
    return set;
}

bool outbox_worker_wait(WaitEventSet *set, int pipe_fd, long timeout_ms) {
    WaitEvent events[3];
    bool latch = false;
    int n = WaitEventSetWait(set, timeout_ms, events, lengthof(events), PG_WAIT_EXTENSION);
    for (int i = 0; i < n; i++) {
        if (events[i].events & WL_LATCH_SET) {
            ResetLatch(MyLatch);
            latch = true;
        }
        if ((events[i].events & WL_SOCKET_READABLE) && pipe_fd >= 0) {
            char buf[64];
            while (read(pipe_fd, buf, sizeof buf) > 0) {
            }
        }
    }
    CHECK_FOR_INTERRUPTS();
    return latch;
}

void outbox_worker_pipe(int fds[2], const char *label) {
    if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0)
        ereport(FATAL, (errmsg("%s: could not create a pipe: %m", label)));
}
