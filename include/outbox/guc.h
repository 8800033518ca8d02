// The outbox.* settings.  Values are read only through these globals.
#pragma once

#include "outbox/pg.h"

extern "C" {
extern char *outbox_database;
extern char *outbox_brokers;
extern char *outbox_kafka_config;
extern char *outbox_kafka_config_file;
extern int outbox_batch_size;
extern int outbox_inbox_batch_bytes_kb;  // outbox.inbox_batch_bytes, in kB
extern int outbox_poll_interval_ms;
extern int outbox_batch_timeout_ms;
extern int outbox_inbox_handler_timeout_ms;
extern int outbox_linger_ms;
extern int outbox_workers;
extern int outbox_max_attempts;
extern bool outbox_synchronous_commit;
extern int outbox_wal_compression;
extern int outbox_retention_s;
extern int outbox_max_message_bytes;
extern char *outbox_default_headers;
extern bool outbox_inbox;
extern char *outbox_inbox_topics;
extern char *outbox_inbox_group;
extern int outbox_inbox_workers;
extern char *outbox_wait_for_standbys;
extern int outbox_standby_lsn;
extern int outbox_delivery;
extern char *outbox_progress_topic;
extern char *outbox_fault_point;
}

// outbox.delivery.
enum OutboxDelivery {
    OUTBOX_DELIVERY_AT_LEAST_ONCE,
    OUTBOX_DELIVERY_EXACTLY_ONCE,
};

// outbox.standby_lsn: which position of a standby counts.
enum OutboxStandbyLsn {
    OUTBOX_STANDBY_LSN_WRITE,
    OUTBOX_STANDBY_LSN_FLUSH,
    OUTBOX_STANDBY_LSN_REPLAY,
};

// outbox.wal_compression: "server", or a method of the server's
// wal_compression for the workers' own sessions.
enum OutboxWalCompression {
    OUTBOX_WAL_COMPRESSION_SERVER = -1,
    OUTBOX_WAL_COMPRESSION_OFF,
    OUTBOX_WAL_COMPRESSION_PGLZ,
    OUTBOX_WAL_COMPRESSION_LZ4,
    OUTBOX_WAL_COMPRESSION_ZSTD,
};

// The wal_compression value outbox.wal_compression stands for; nullptr
// for "server" (the server's own setting applies).
const char *outbox_wal_compression_value(void);

// Whether a topic name (`len` bytes) is outbox.progress_topic: the
// exactly-once relays' own, where no message may go.
bool outbox_is_progress_topic(const char *topic, std::size_t len) noexcept;

// True in every process of a server started with shared_preload_libraries
// = 'outbox' (set by _PG_init in the postmaster, inherited by its children).
extern bool outbox_preloaded;

// Defines every outbox.* GUC and reserves the prefix.  Called from _PG_init.
void outbox_define_gucs(void);
