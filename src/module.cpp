// Library entry point: settings, the commit wake-up, and (when preloaded)
// shared memory and the background workers.
#include "outbox/pg.h"

extern "C" {
#include "miscadmin.h"
}

#include "outbox/guc.h"
#include "outbox/workers.h"
#include "outbox/shmem.h"
#include "outbox/wakeup.h"

extern "C" {
PG_MODULE_MAGIC;

PGDLLEXPORT void _PG_init(void);

void _PG_init(void) {
    outbox_define_gucs();
    outbox_wakeup_init();
    // Without shared_preload_libraries the SQL functions still work and the
    // messages wait in the table for a server that runs the relay.
    if (!process_shared_preload_libraries_in_progress) return;
    outbox_preloaded = true;
    outbox_shmem_init();
    // pg_upgrade runs the new server in binary-upgrade mode to restore the
    // schema: a worker connected to a database then makes its DROP DATABASE
    // fail ("being accessed by other users"), and nothing may be published
    // or handled from a half-restored cluster.  No workers in that mode.
    if (IsBinaryUpgrade) {
        ereport(LOG, (errmsg("pg outbox: binary-upgrade mode (pg_upgrade): no background workers")));
        return;
    }
    outbox_register_workers();
}
}
