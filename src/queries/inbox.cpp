#include "outbox/queries/inbox.h"
#include "outbox/worker_common.h"

#include "outbox/policy.h"
#include "outbox/queries/inbox_sql.h"
#include "outbox/queries/spi.h"

extern "C" {
#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/uuid.h"
}

namespace sql = outbox::sql::inbox;

namespace {

OutboxQuery insert_query = {"storing inbox records", sql::kInsert, 12,
                            {TEXTARRAYOID, TEXTARRAYOID, TEXTARRAYOID, BYTEAARRAYOID, TEXTARRAYOID,
                             BYTEAARRAYOID, TEXTARRAYOID, INT4ARRAYOID, INT8ARRAYOID, INT8ARRAYOID,
                             TEXTARRAYOID, TEXTARRAYOID},
                            SPI_OK_INSERT, nullptr};
OutboxQuery insert_raw_query = {"storing an inbox record", sql::kInsertRaw, 12,
                                {TEXTOID, TEXTOID, TEXTOID, BYTEAOID, TEXTOID, BYTEAOID, TEXTOID,
                                 INT4OID, INT8OID, INT8OID, TEXTOID, TEXTOID},
                                SPI_OK_INSERT, nullptr};
OutboxQuery note_intake_query = {"noting inbox intake", sql::kNoteIntake, 3,
                                 {TEXTOID, INT8OID, TEXTOID}, SPI_OK_INSERT, nullptr};
OutboxQuery subscriptions_query = {"reading inbox subscriptions", sql::kSubscriptions, 0, {},
                                   SPI_OK_SELECT, nullptr};
OutboxQuery subscriptions_query_before_16 = {"reading inbox subscriptions",
                                             sql::kSubscriptionsBefore16, 0, {}, SPI_OK_SELECT,
                                             nullptr};
OutboxQuery retrying_query = {"reading retrying inbox keys", sql::kRetryingKeys, 1, {TEXTOID},
                              SPI_OK_SELECT, nullptr};
OutboxQuery claim_query = {"claiming inbox records", sql::kClaim, 5,
                           {INT4OID, TEXTOID, INT4OID, INT4OID, TEXTARRAYOID}, SPI_OK_SELECT,
                           nullptr};
OutboxQuery next_retry_query = {"reading inbox retries", sql::kNextRetry, 0, {}, SPI_OK_SELECT,
                                nullptr};
OutboxQuery done_query = {"marking inbox records processed", sql::kDone, 2,
                          {UUIDARRAYOID, TEXTOID}, SPI_OK_UPDATE, nullptr};
OutboxQuery failed_query = {"recording a failed handler call", sql::kFailed, 6,
                            {UUIDOID, TEXTOID, INT4OID, FLOAT8OID, FLOAT8OID, TEXTOID},
                            SPI_OK_UPDATE_RETURNING, nullptr};

Datum bytea_array(bytea *const *values, int n) {
    Datum *elems = static_cast<Datum *>(palloc(sizeof(Datum) * (n > 0 ? n : 1)));
    bool *nulls = static_cast<bool *>(palloc(sizeof(bool) * (n > 0 ? n : 1)));
    for (int i = 0; i < n; i++) {
        nulls[i] = values[i] == nullptr;
        elems[i] = PointerGetDatum(values[i]);
    }
    return outbox_array(elems, nulls, n, BYTEAOID);
}

}  // namespace

int64 outbox_inbox_insert(const OutboxInboxRow *rows, int n) {
    auto strings = [&](auto field) {
        const char **v = static_cast<const char **>(palloc(sizeof(char *) * (n > 0 ? n : 1)));
        for (int i = 0; i < n; i++) v[i] = field(rows[i]);
        return outbox_text_array_nullable(v, n);
    };
    auto bytes = [&](auto field) {
        bytea **v = static_cast<bytea **>(palloc(sizeof(bytea *) * (n > 0 ? n : 1)));
        for (int i = 0; i < n; i++) v[i] = field(rows[i]);
        return bytea_array(v, n);
    };
    Datum *partitions = static_cast<Datum *>(palloc(sizeof(Datum) * (n > 0 ? n : 1)));
    int64 *offsets = static_cast<int64 *>(palloc(sizeof(int64) * (n > 0 ? n : 1)));
    int64 *stamps = static_cast<int64 *>(palloc(sizeof(int64) * (n > 0 ? n : 1)));
    for (int i = 0; i < n; i++) {
        partitions[i] = Int32GetDatum(rows[i].partition);
        offsets[i] = rows[i].offset;
        stamps[i] = rows[i].timestamp;
    }
    Datum values[12] = {
        strings([](const OutboxInboxRow &r) { return r.event_id; }),
        strings([](const OutboxInboxRow &r) { return r.topic; }),
        strings([](const OutboxInboxRow &r) { return r.key; }),
        bytes([](const OutboxInboxRow &r) { return r.key_bytes; }),
        strings([](const OutboxInboxRow &r) { return r.payload; }),
        bytes([](const OutboxInboxRow &r) { return r.value; }),
        strings([](const OutboxInboxRow &r) { return r.headers; }),
        PointerGetDatum(construct_array(partitions, n, INT4OID, 4, true, TYPALIGN_INT)),
        outbox_int8_array(offsets, n),
        outbox_int8_array(stamps, n),
        strings([](const OutboxInboxRow &r) { return r.header_names; }),
        strings([](const OutboxInboxRow &r) { return r.header_values; })};
    return static_cast<int64>(outbox_run(&insert_query, values, nullptr, 0));
}

int64 outbox_inbox_insert_raw(const OutboxInboxRow *row) {
    Datum values[12] = {row->event_id ? CStringGetTextDatum(row->event_id) : 0,
                        CStringGetTextDatum(row->topic),
                        row->key ? CStringGetTextDatum(row->key) : 0,
                        PointerGetDatum(row->key_bytes),
                        CStringGetTextDatum(row->payload),
                        PointerGetDatum(row->value),
                        CStringGetTextDatum(row->headers),
                        Int32GetDatum(row->partition),
                        Int64GetDatum(row->offset),
                        Int64GetDatum(row->timestamp),
                        CStringGetTextDatum(row->header_names),
                        CStringGetTextDatum(row->header_values)};
    char nulls[12] = {row->event_id ? ' ' : 'n', ' ', row->key ? ' ' : 'n',
                      row->key_bytes ? ' ' : 'n', ' ', row->value ? ' ' : 'n', ' ', ' ', ' ', ' ',
                      ' ', ' '};
    return static_cast<int64>(outbox_run(&insert_raw_query, values, nulls, 0));
}

void outbox_inbox_note_intake(const char *topic, int64 n, const char *note) {
    Datum values[3] = {CStringGetTextDatum(topic), Int64GetDatum(n), CStringGetTextDatum(note)};
    outbox_run(&note_intake_query, values, nullptr, 0);
}

int outbox_inbox_subscriptions(int schema, OutboxSubscription **subs) {
    OutboxQuery *q = schema >= kOutboxSchema16 ? &subscriptions_query : &subscriptions_query_before_16;
    int n = static_cast<int>(outbox_run(q, nullptr, nullptr, 0));
    *subs = static_cast<OutboxSubscription *>(palloc0(sizeof(OutboxSubscription) * (n + 1)));
    for (int i = 0; i < n; i++) {
        bool isnull;
        OutboxSubscription &s = (*subs)[i];
        s.topic = outbox_col_text(i, sql::kSubTopic);
        Datum handler = outbox_col(i, sql::kSubHandler, &isnull);
        s.handler = isnull ? InvalidOid : DatumGetObjectId(handler);
        s.handler_name = outbox_col_text(i, sql::kSubHandlerName);
        Datum owner = outbox_col(i, sql::kSubFunctionOwner, &isnull);
        s.exists = !isnull;
        s.owner = isnull ? InvalidOid : DatumGetObjectId(owner);
        Datum batch = outbox_col(i, sql::kSubBatch, &isnull);
        s.batch = !isnull && DatumGetBool(batch);
        Datum allowed = outbox_col(i, sql::kSubAllowed, &isnull);
        s.allowed = !isnull && DatumGetBool(allowed);
        Datum subscriber = outbox_col(i, sql::kSubSubscriber, &isnull);
        s.subscriber = isnull ? InvalidOid : DatumGetObjectId(subscriber);
        Datum subscriber_exists = outbox_col(i, sql::kSubSubscriberExists, &isnull);
        s.subscriber_exists = !isnull && DatumGetBool(subscriber_exists);
    }
    return n;
}

char **outbox_inbox_retrying_keys(const char *topic, int *n) {
    Datum values[1] = {CStringGetTextDatum(topic)};
    *n = static_cast<int>(outbox_run(&retrying_query, values, nullptr, 0));
    char **keys = static_cast<char **>(palloc(sizeof(char *) * (*n + 1)));
    for (int i = 0; i < *n; i++) keys[i] = outbox_col_text(i, 1);
    return keys;
}

int outbox_inbox_claim(const char *topic, int limit, OutboxShare share, char **blocked,
                       int nblocked, int64 byte_budget, OutboxInboxClaim **rows) {
    std::size_t *blen = static_cast<std::size_t *>(palloc(sizeof(std::size_t) * (nblocked + 1)));
    for (int i = 0; i < nblocked; i++) blen[i] = strlen(blocked[i]);
    Datum values[5] = {Int32GetDatum(limit), CStringGetTextDatum(topic),
                       Int32GetDatum(share.count), Int32GetDatum(share.index),
                       outbox_text_array(blocked, blen, nblocked)};
    // Read a few rows at a time (one first, then as many as the budget left
    // holds at the size seen so far, a few dozen at most), so that the
    // records held at once stay near `byte_budget` (the first always
    // comes).  The rows not read are not locked: they stay for a later
    // claim.  Each row's bytes are its record's, whole.
    Portal portal = outbox_open_cursor(&claim_query, values, nullptr);
    auto *out = static_cast<OutboxInboxClaim *>(palloc(sizeof(OutboxInboxClaim) * (limit + 1)));
    int n = 0;
    int64 bytes = 0;
    long chunk = 1;
    while (n < limit && (n == 0 || bytes < byte_budget)) {
        long want = Min(static_cast<long>(limit - n), chunk);
        SPI_cursor_fetch(portal, true, want);
        uint64 got = SPI_processed;
        for (uint64 i = 0; i < got; i++) {
            bool isnull;
            OutboxInboxClaim &r = out[n++];
            r.row = outbox_col(i, sql::kClaimRow, &isnull);
            r.event_id = outbox_col(i, sql::kClaimEventId, &isnull);
            r.key = outbox_col_text(i, sql::kClaimKey);  // NULL stays nullptr
            bytes += SPI_tuptable->vals[i]->t_len;
        }
        if (static_cast<long>(got) < want) break;
        int64 mean = Max(bytes / n, static_cast<int64>(1));
        chunk = static_cast<long>(Min(static_cast<int64>(outbox::policy::kHandlerFetchRows),
                                      Max(static_cast<int64>(1), (byte_budget - bytes) / mean)));
    }
    SPI_cursor_close(portal);
    *rows = out;
    return n;
}

void outbox_inbox_done(const char *topic, const Datum *event_ids, int n) {
    if (n == 0) return;
    Datum values[2] = {PointerGetDatum(construct_array(const_cast<Datum *>(event_ids), n, UUIDOID,
                                                       UUID_LEN, false, TYPALIGN_CHAR)),
                       CStringGetTextDatum(topic)};
    outbox_run(&done_query, values, nullptr, 0);
}

bool outbox_inbox_failed(const char *topic, Datum event_id, const char *error, int max_attempts) {
    Datum values[6] = {event_id, CStringGetTextDatum(error), Int32GetDatum(max_attempts),
                       Float8GetDatum(outbox::policy::kHandlerRetryBaseSeconds),
                       Float8GetDatum(outbox::policy::kHandlerRetryCapSeconds),
                       CStringGetTextDatum(topic)};
    uint64 n = outbox_run(&failed_query, values, nullptr, 0);
    bool isnull;
    return n > 0 && DatumGetBool(outbox_col(0, 1, &isnull));
}

TimestampTz outbox_inbox_next_retry(void) {
    if (outbox_run(&next_retry_query, nullptr, nullptr, 0) == 0) return 0;
    bool isnull = true;
    Datum d = outbox_col(0, 1, &isnull);
    return isnull ? 0 : DatumGetTimestampTz(d);
}
