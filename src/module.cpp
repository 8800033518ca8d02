// Library entry point: settings, the commit wake-up, and (when preloaded)
// shared memory and the background workers.
#include "outbox/pg.h"

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
    outbox_register_workers();
}
}
