// The outbox.* settings.  Values are read only through these globals.
#pragma once

#include "outbox/pg.h"

extern "C" {
extern char *outbox_database;
extern char *outbox_brokers;
extern char *outbox_kafka_config;
extern int outbox_batch_size;
extern int outbox_poll_interval_ms;
extern int outbox_batch_timeout_ms;
extern int outbox_workers;
extern int outbox_max_attempts;
extern bool outbox_synchronous_commit;
extern int outbox_retention_s;
extern bool outbox_inbox;
extern char *outbox_inbox_topics;
extern char *outbox_inbox_group;
}

// Defines every outbox.* GUC and reserves the prefix.  Called from _PG_init.
void outbox_define_gucs(void);
