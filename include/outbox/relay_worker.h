// The relay background worker: claims pending outbox rows and publishes
// them to Kafka.
#pragma once

#include "outbox/pg.h"

extern "C" PGDLLEXPORT void outbox_relay_main(Datum main_arg);
