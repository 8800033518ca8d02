// The relay background worker: claims pending outbox rows and publishes
// them to Kafka.
#pragma once

#include "outbox/pg.h"

// Registers outbox.workers relay workers (from _PG_init while preloading).
void outbox_register_relay_workers(void);

extern "C" PGDLLEXPORT void outbox_relay_main(Datum main_arg);
