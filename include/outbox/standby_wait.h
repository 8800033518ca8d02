// outbox.wait_for_standbys, the Postgres side: where a batch's WAL ends, and
// whether the standbys the setting names hold it.  Read from the
// walsenders' shared memory (pg_stat_replication's source) without a
// query; standbys' names come from the backend status table, looked up only
// when a walsender appears that was not seen before.  The rule itself is
// pure C++ (outbox/common/standby.h).
#pragma once

#include "outbox/pg.h"

extern "C" {
#include "access/xlogdefs.h"
}

// Whether outbox.wait_for_standbys names any standby.
bool outbox_standbys_required(void);

// After a claim, inside its transaction: an LSN at or past the commit
// record of every row the claim's snapshot sees, flushed here (a walsender
// sends only flushed WAL).  The claim's own row locks come after its
// snapshot, so the end of this transaction's last record is such an LSN.
XLogRecPtr outbox_batch_wal_end(void);

// Whether the standbys hold WAL up to `target` (always, when the setting
// names none).  When they do not, `why` says which one lacks it.
bool outbox_standbys_hold(XLogRecPtr target, char *why, std::size_t len);
