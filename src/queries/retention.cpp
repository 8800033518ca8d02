#include "outbox/queries/retention.h"

#include "outbox/queries/retention_sql.h"
#include "outbox/queries/spi.h"
#include "outbox/worker_common.h"

extern "C" {
#include "catalog/pg_type.h"
#include "utils/uuid.h"
}

namespace sql = outbox::sql::retention;

namespace {

OutboxQuery published_query = {
    "deleting old published messages", sql::kRetentionPublished, 4,
    {TIMESTAMPTZOID, INT4OID, INT8OID, INT8OID}, SPI_OK_DELETE_RETURNING, nullptr};
OutboxQuery processed_query = {
    "deleting expired processed events", sql::kRetentionProcessedEvents, 3,
    {TIMESTAMPTZOID, INT4OID, TIMESTAMPTZOID}, SPI_OK_DELETE_RETURNING, nullptr};
OutboxQuery inbox_query = {
    "deleting old processed inbox records", sql::kRetentionInbox, 3,
    {TIMESTAMPTZOID, INT4OID, TIMESTAMPTZOID}, SPI_OK_DELETE_RETURNING, nullptr};
OutboxQuery first_id_query = {"finding where old messages end", sql::kFirstIdSince, 1, {UUIDOID},
                              SPI_OK_SELECT, nullptr};
OutboxQuery straggler_query = {"looking for pending messages below the relays' mark",
                               sql::kStraggler, 2, {INT8OID, BOOLOID}, SPI_OK_SELECT, nullptr};
OutboxQuery straggler_query_before_13 = {"looking for pending messages below the relays' mark",
                                         sql::kStragglerBefore13, 1, {INT8OID}, SPI_OK_SELECT,
                                         nullptr};

// The smallest version 7 UUID of time t's millisecond.
pg_uuid_t *uuid7_floor(TimestampTz t) {
    auto *u = static_cast<pg_uuid_t *>(palloc0(sizeof(pg_uuid_t)));
    int64 ms = t / 1000 + static_cast<int64>(POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) *
                              SECS_PER_DAY * 1000;
    if (ms < 0) ms = 0;
    for (int i = 0; i < 6; i++) u->data[i] = static_cast<unsigned char>(ms >> (8 * (5 - i)));
    return u;
}

}  // namespace

int64 outbox_retention_delete(OutboxRetention which, TimestampTz cutoff, int limit,
                              int64 *from) {
    uint64 n;
    bool isnull;
    if (which == OUTBOX_RETENTION_PUBLISHED) {
        Datum bound_args[1] = {UUIDPGetDatum(uuid7_floor(cutoff))};
        int64 upper = PG_INT64_MAX;
        // Only a time-ordered (version 7) id bounds anything: rows inserted
        // with random ids (v4) are all over that index.
        if (outbox_run(&first_id_query, bound_args, nullptr, 1) > 0 &&
            (DatumGetUUIDP(outbox_col(0, 2, &isnull))->data[6] >> 4) == 7)
            upper = DatumGetInt64(outbox_col(0, 1, &isnull));
        Datum values[4] = {TimestampTzGetDatum(cutoff), Int32GetDatum(limit), Int64GetDatum(*from),
                           Int64GetDatum(upper)};
        n = outbox_run(&published_query, values, nullptr, 0);
    } else {
        Datum values[3] = {TimestampTzGetDatum(cutoff), Int32GetDatum(limit),
                           TimestampTzGetDatum(*from)};
        n = outbox_run(which == OUTBOX_RETENTION_INBOX ? &inbox_query : &processed_query, values,
                       nullptr, 0);
    }
    // Both keys are int64 underneath: ids, or timestamps in microseconds.
    for (uint64 i = 0; i < n; i++) {
        int64 key = DatumGetInt64(outbox_col(i, 1, &isnull));
        if (which == OUTBOX_RETENTION_PUBLISHED) key += 1;
        if (key > *from) *from = key;
    }
    return static_cast<int64>(n);
}

int64 outbox_straggler_below(int schema, int64 below, bool waiting) {
    Datum values[2] = {Int64GetDatum(below), BoolGetDatum(!waiting)};
    OutboxQuery *q = schema >= kOutboxSchema13 ? &straggler_query : &straggler_query_before_13;
    if (outbox_run(q, values, nullptr, 1) == 0) return -1;
    bool isnull;
    return DatumGetInt64(outbox_col(0, 1, &isnull));
}
