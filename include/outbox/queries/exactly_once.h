// Exactly-once delivery, the Postgres side: outbox.relay_transaction (schema
// 1.5), one row per Kafka transactional id a relay of this database used:
// the last transaction whose rows this database marked published, and
// whether the relay that used the id stopped cleanly.  Inside a transaction
// with SPI connected; each may ereport(ERROR).
#pragma once

#include "outbox/pg.h"

// Locks the row of `tid` (made first, at seq 0, clean), returns its seq.
int64 outbox_txn_lock(const char *tid, bool *clean);

// Sets the row of `tid` (locked or not).
void outbox_txn_set(const char *tid, int64 seq, bool clean);

// The ids, starting with `prefix`, of relays that did not stop cleanly and
// are none of `current` (n of them): locked, in order.  Palloc'd.
int outbox_txn_lock_stale(const char *prefix, const char *const *current, int n,
                          char ***tids, int64 **seqs);

// The ids that do not start with `prefix` (another system identifier: a
// cluster made by pg_upgrade, or restored from another server) of relays
// that did not stop cleanly: locked, in order.  Palloc'd.
int outbox_txn_lock_foreign(const char *prefix, char ***tids, int64 **seqs);

// The sum of progress::row_digest() of this database's rows with ids `ids`
// (n of them, published or not); *found: how many of them exist.
uint64 outbox_txn_rows_digest(const int64 *ids, int n, int *found);
