#include "outbox/wakeup.h"

#include "outbox/low_water.h"
#include "outbox/shmem.h"

extern "C" {
#include "access/xact.h"
}

namespace {

// Set by outbox.write*() (and inbox writes, retries, replays); read and
// cleared at the end of the transaction.
bool wrote_in_this_transaction = false;
bool rescan_in_this_transaction = false;
bool inbox_in_this_transaction = false;

// Runs after the commit is visible to other transactions (after
// ProcArrayEndTransaction), so the relay that wakes up sees the rows.
// Only commits that wrote a message wake it, and only once each.
void on_xact_event(XactEvent event, void *) {
    switch (event) {
        case XACT_EVENT_COMMIT:
        case XACT_EVENT_PARALLEL_COMMIT:
            // The rows are visible now: the low-water mark's announcement
            // (outbox/low_water.h).
            outbox_writer_done(true);
            if (rescan_in_this_transaction) {
                rescan_in_this_transaction = false;
                outbox_relay_rescan_from(MyDatabaseId, 0);
            }
            if (wrote_in_this_transaction) {
                wrote_in_this_transaction = false;
                outbox_wake(OUTBOX_ROLE_RELAY, MyDatabaseId);
            }
            if (inbox_in_this_transaction) {
                inbox_in_this_transaction = false;
                outbox_wake(OUTBOX_ROLE_INBOX_HANDLER, MyDatabaseId);
            }
            break;
        case XACT_EVENT_ABORT:
        case XACT_EVENT_PARALLEL_ABORT:
        case XACT_EVENT_PREPARE:  // COMMIT PREPARED runs elsewhere (outbox/low_water.h)
            outbox_writer_done(false);
            wrote_in_this_transaction = false;
            rescan_in_this_transaction = false;
            inbox_in_this_transaction = false;
            break;
        default:
            break;
    }
}

}  // namespace

void outbox_wakeup_init(void) { RegisterXactCallback(on_xact_event, nullptr); }

void outbox_wakeup_note_write(void) { wrote_in_this_transaction = true; }

void outbox_wakeup_note_rescan(void) {
    rescan_in_this_transaction = true;
    wrote_in_this_transaction = true;
}

void outbox_wakeup_note_inbox(void) { inbox_in_this_transaction = true; }
