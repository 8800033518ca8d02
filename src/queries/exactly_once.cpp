#include "outbox/queries/exactly_once.h"

#include <cstring>

#include "outbox/common/progress.h"
#include "outbox/queries/spi.h"

extern "C" {
#include "catalog/pg_type.h"
#include "utils/builtins.h"
}

namespace {

OutboxQuery make_query = {
    "registering a transactional id",
    "INSERT INTO outbox.relay_transaction (transactional_id) VALUES ($1)"
    " ON CONFLICT (transactional_id) DO NOTHING",
    1, {TEXTOID}, SPI_OK_INSERT, nullptr};
OutboxQuery lock_query = {
    "locking a transactional id",
    "SELECT seq, clean FROM outbox.relay_transaction WHERE transactional_id = $1 FOR UPDATE",
    1, {TEXTOID}, SPI_OK_SELECT, nullptr};
OutboxQuery set_query = {
    "recording a transaction",
    "UPDATE outbox.relay_transaction SET seq = $2, clean = $3,"
    " updated_at = pg_catalog.statement_timestamp() WHERE transactional_id = $1",
    3, {TEXTOID, INT8OID, BOOLOID}, SPI_OK_UPDATE, nullptr};
OutboxQuery stale_query = {
    "finding relays that did not stop cleanly",
    "SELECT transactional_id, seq FROM outbox.relay_transaction"
    " WHERE pg_catalog.starts_with(transactional_id, $1) AND NOT clean"
    " AND transactional_id <> ALL ($2) ORDER BY transactional_id FOR UPDATE",
    2, {TEXTOID, TEXTARRAYOID}, SPI_OK_SELECT, nullptr};

OutboxQuery foreign_query = {
    "finding transactional ids of another system identifier",
    "SELECT transactional_id, seq FROM outbox.relay_transaction"
    " WHERE NOT pg_catalog.starts_with(transactional_id, $1) AND NOT clean"
    " ORDER BY transactional_id FOR UPDATE",
    1, {TEXTOID}, SPI_OK_SELECT, nullptr};

OutboxQuery rows_query = {
    "reading the rows of a Kafka transaction",
    "SELECT id, message_id::text FROM outbox.outbox_message WHERE id = ANY ($1)",
    1, {INT8ARRAYOID}, SPI_OK_SELECT, nullptr};

}  // namespace

uint64 outbox_txn_rows_digest(const int64 *ids, int n, int *found) {
    *found = 0;
    if (n == 0) return 0;
    Datum args[1] = {outbox_int8_array(ids, n)};
    uint64 rows = outbox_run(&rows_query, args, nullptr, 0);
    uint64 digest = 0;
    for (uint64 i = 0; i < rows; i++) {
        bool isnull;
        int64 id = DatumGetInt64(outbox_col(i, 1, &isnull));
        char *message_id = outbox_col_text(i, 2);
        digest += outbox::progress::row_digest(id, message_id);
        pfree(message_id);
    }
    *found = static_cast<int>(rows);
    return digest;
}

int64 outbox_txn_lock(const char *tid, bool *clean) {
    Datum args[1] = {CStringGetTextDatum(tid)};
    outbox_run(&make_query, args, nullptr, 0);
    if (outbox_run(&lock_query, args, nullptr, 1) != 1)
        ereport(ERROR, (errmsg("pg outbox: transactional id %s vanished", tid)));
    bool isnull;
    int64 seq = DatumGetInt64(outbox_col(0, 1, &isnull));
    *clean = DatumGetBool(outbox_col(0, 2, &isnull));
    return seq;
}

void outbox_txn_set(const char *tid, int64 seq, bool clean) {
    Datum args[3] = {CStringGetTextDatum(tid), Int64GetDatum(seq), BoolGetDatum(clean)};
    outbox_run(&set_query, args, nullptr, 0);
}

namespace {

// The (transactional_id, seq) rows the last statement returned.  Palloc'd.
int tid_rows(uint64 n, char ***tids, int64 **seqs) {
    int rows = static_cast<int>(n);
    *tids = static_cast<char **>(palloc(sizeof(char *) * (rows > 0 ? rows : 1)));
    *seqs = static_cast<int64 *>(palloc(sizeof(int64) * (rows > 0 ? rows : 1)));
    for (int i = 0; i < rows; i++) {
        bool isnull;
        (*tids)[i] = outbox_col_text(static_cast<uint64>(i), 1);
        (*seqs)[i] = DatumGetInt64(outbox_col(static_cast<uint64>(i), 2, &isnull));
    }
    return rows;
}

}  // namespace

int outbox_txn_lock_foreign(const char *prefix, char ***tids, int64 **seqs) {
    Datum args[1] = {CStringGetTextDatum(prefix)};
    return tid_rows(outbox_run(&foreign_query, args, nullptr, 0), tids, seqs);
}

int outbox_txn_lock_stale(const char *prefix, const char *const *current, int n, char ***tids,
                          int64 **seqs) {
    std::size_t *lengths = static_cast<std::size_t *>(palloc(sizeof(std::size_t) * (n > 0 ? n : 1)));
    for (int i = 0; i < n; i++) lengths[i] = strlen(current[i]);
    Datum args[2] = {CStringGetTextDatum(prefix), outbox_text_array(current, lengths, n)};
    return tid_rows(outbox_run(&stale_query, args, nullptr, 0), tids, seqs);
}
