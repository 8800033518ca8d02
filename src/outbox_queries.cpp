#include "outbox/outbox_queries.h"

extern "C" {
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
}

namespace {

SPIPlanPtr claim_plan = nullptr;
SPIPlanPtr mark_plan = nullptr;
SPIPlanPtr mark_claimed_plan = nullptr;
SPIPlanPtr failure_plan = nullptr;
SPIPlanPtr insert_plan = nullptr;
SPIPlanPtr retention_plans[3] = {nullptr, nullptr, nullptr};

// Prepares `sql` once per process and keeps the plan; the plan cache
// re-plans it by itself when the table changes (or is recreated).
SPIPlanPtr saved_plan(SPIPlanPtr *slot, const char *sql, int nargs, Oid *argtypes) {
    if (*slot == nullptr) {
        SPIPlanPtr plan = SPI_prepare(sql, nargs, argtypes);
        if (plan == nullptr)
            elog(ERROR, "pg outbox: preparing \"%s\" failed: %s", sql,
                 SPI_result_code_string(SPI_result));
        SPI_keepplan(plan);
        *slot = plan;
    }
    return *slot;
}

// A text datum's bytes, without copying unless it is compressed or toasted.
const char *text_bytes(Datum d, std::size_t *len) {
    text *t = reinterpret_cast<text *>(pg_detoast_datum_packed(reinterpret_cast<varlena *>(DatumGetPointer(d))));
    *len = VARSIZE_ANY_EXHDR(t);
    return VARDATA_ANY(t);
}

void format_uuid(const pg_uuid_t *u, char *out) {
    static const char hex[] = "0123456789abcdef";
    int o = 0;
    for (int i = 0; i < UUID_LEN; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10) out[o++] = '-';
        out[o++] = hex[u->data[i] >> 4];
        out[o++] = hex[u->data[i] & 0xf];
    }
    out[o] = '\0';
}

Datum int8_array(const int64 *ids, int n) {
    Datum *elems = static_cast<Datum *>(palloc(sizeof(Datum) * n));
    for (int i = 0; i < n; i++) elems[i] = Int64GetDatum(ids[i]);
    return PointerGetDatum(construct_array(elems, n, INT8OID, sizeof(int64), FLOAT8PASSBYVAL,
                                           TYPALIGN_DOUBLE));
}

}  // namespace

bool outbox_extension_ready(void) {
    return OidIsValid(get_extension_oid("outbox", true));
}

int outbox_claim_batch(int limit, int nworkers, int worker, Datum skip_keys,
                       outbox::kafka::Record **records, ItemPointerData **ctids) {
    Oid types[4] = {INT4OID, TEXTARRAYOID, INT4OID, INT4OID};
    Datum values[4] = {Int32GetDatum(limit), skip_keys, Int32GetDatum(nworkers),
                       Int32GetDatum(worker)};
    int rc = SPI_execute_plan(saved_plan(&claim_plan, outbox::sql::kClaim, 4, types), values,
                              nullptr, false, limit);
    if (rc != SPI_OK_SELECT)
        elog(ERROR, "pg outbox: claiming pending messages failed: %s", SPI_result_code_string(rc));

    int n = static_cast<int>(SPI_processed);
    *records = nullptr;
    *ctids = nullptr;
    if (n == 0) return 0;

    auto *tids = static_cast<ItemPointerData *>(palloc(sizeof(ItemPointerData) * n));
    auto *recs = static_cast<outbox::kafka::Record *>(palloc(sizeof(outbox::kafka::Record) * n));
    char *event_ids = static_cast<char *>(palloc(static_cast<Size>(n) * (UUID_LEN * 2 + 5)));
    TupleDesc desc = SPI_tuptable->tupdesc;
    for (int i = 0; i < n; i++) {
        HeapTuple tup = SPI_tuptable->vals[i];
        bool isnull;
        outbox::kafka::Record &r = recs[i];
        r.id = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));
        char *eid = event_ids + static_cast<Size>(i) * (UUID_LEN * 2 + 5);
        format_uuid(DatumGetUUIDP(SPI_getbinval(tup, desc, 2, &isnull)), eid);
        r.event_id = eid;
        r.topic = text_bytes(SPI_getbinval(tup, desc, 3, &isnull), &r.topic_len);
        r.key = text_bytes(SPI_getbinval(tup, desc, 4, &isnull), &r.key_len);
        r.value = text_bytes(SPI_getbinval(tup, desc, 5, &isnull), &r.value_len);
        r.headers = text_bytes(SPI_getbinval(tup, desc, 6, &isnull), &r.headers_len);
        ItemPointerCopy(reinterpret_cast<ItemPointer>(DatumGetPointer(SPI_getbinval(tup, desc, 7, &isnull))), &tids[i]);
    }
    *records = recs;
    *ctids = tids;
    return n;
}

Datum outbox_text_array(const char *const *values, const std::size_t *lengths, int n) {
    Datum *elems = static_cast<Datum *>(palloc(sizeof(Datum) * (n > 0 ? n : 1)));
    for (int i = 0; i < n; i++)
        elems[i] = PointerGetDatum(cstring_to_text_with_len(values[i], static_cast<int>(lengths[i])));
    return PointerGetDatum(construct_array(elems, n, TEXTOID, -1, false, TYPALIGN_INT));
}

void outbox_mark_published(const int64 *ids, int n) {
    if (n == 0) return;
    Oid types[1] = {INT8ARRAYOID};
    Datum values[1] = {int8_array(ids, n)};
    SetCurrentStatementStartTimestamp();
    int rc = SPI_execute_plan(saved_plan(&mark_plan, outbox::sql::kMarkPublished, 1, types), values, nullptr, false, 0);
    if (rc != SPI_OK_UPDATE)
        elog(ERROR, "pg outbox: marking messages published failed: %s", SPI_result_code_string(rc));
}

void outbox_mark_claimed_published(const ItemPointerData *ctids, int n) {
    if (n == 0) return;
    Datum *elems = static_cast<Datum *>(palloc(sizeof(Datum) * n));
    for (int i = 0; i < n; i++) elems[i] = PointerGetDatum(&ctids[i]);
    Oid types[1] = {TIDARRAYOID};
    Datum values[1] = {PointerGetDatum(construct_array(elems, n, TIDOID, sizeof(ItemPointerData),
                                                       false, TYPALIGN_SHORT))};
    SetCurrentStatementStartTimestamp();
    int rc = SPI_execute_plan(saved_plan(&mark_claimed_plan, outbox::sql::kMarkClaimedPublished, 1,
                                         types),
                              values, nullptr, false, 0);
    if (rc != SPI_OK_UPDATE)
        elog(ERROR, "pg outbox: marking messages published failed: %s", SPI_result_code_string(rc));
    if (SPI_processed != static_cast<uint64>(n))
        elog(WARNING, "pg outbox: marked %llu of %d acknowledged rows published",
             static_cast<unsigned long long>(SPI_processed), n);
}

int outbox_record_failures(const int64 *ids, const char *const *errors, const bool *permanent,
                           int n, int max_attempts) {
    if (n == 0) return 0;
    Datum *texts = static_cast<Datum *>(palloc(sizeof(Datum) * n));
    Datum *flags = static_cast<Datum *>(palloc(sizeof(Datum) * n));
    for (int i = 0; i < n; i++) {
        texts[i] = CStringGetTextDatum(errors[i]);
        flags[i] = BoolGetDatum(permanent[i]);
    }
    Oid types[4] = {INT8ARRAYOID, TEXTARRAYOID, BOOLARRAYOID, INT4OID};
    Datum values[4] = {int8_array(ids, n),
                       PointerGetDatum(construct_array(texts, n, TEXTOID, -1, false, TYPALIGN_INT)),
                       PointerGetDatum(construct_array(flags, n, BOOLOID, 1, true, TYPALIGN_CHAR)),
                       Int32GetDatum(max_attempts)};
    int rc = SPI_execute_plan(saved_plan(&failure_plan, outbox::sql::kRecordFailures, 4, types),
                              values, nullptr, false, 0);
    if (rc != SPI_OK_UPDATE_RETURNING)
        elog(ERROR, "pg outbox: recording failed deliveries failed: %s",
             SPI_result_code_string(rc));
    // One line per message parked now (rare); never the payload.
    TupleDesc desc = SPI_tuptable->tupdesc;
    int parked = 0;
    for (uint64 i = 0; i < SPI_processed; i++) {
        HeapTuple tup = SPI_tuptable->vals[i];
        bool isnull;
        if (!DatumGetBool(SPI_getbinval(tup, desc, 4, &isnull))) continue;
        parked++;
        ereport(WARNING,
                (errmsg("pg outbox: parked message %s (topic \"%s\") after %s refusals by Kafka",
                        SPI_getvalue(tup, desc, 1), SPI_getvalue(tup, desc, 2),
                        SPI_getvalue(tup, desc, 3)),
                 errdetail("Last error: %s", SPI_getvalue(tup, desc, 5)),
                 errhint("See outbox.parked_messages; outbox.retry(message_id) puts it back.")));
    }
    return parked;
}

int64 outbox_retention_delete(OutboxRetention which, TimestampTz cutoff, int limit) {
    static const char *const sql[] = {outbox::sql::kRetentionPublished,
                                      outbox::sql::kRetentionProcessedEvents,
                                      outbox::sql::kRetentionInbox};
    Oid types[2] = {TIMESTAMPTZOID, INT4OID};
    Datum values[2] = {TimestampTzGetDatum(cutoff), Int32GetDatum(limit)};
    int rc = SPI_execute_plan(saved_plan(&retention_plans[which], sql[which], 2, types), values,
                              nullptr, false, 0);
    if (rc != SPI_OK_DELETE)
        elog(ERROR, "pg outbox: retention failed: %s", SPI_result_code_string(rc));
    return static_cast<int64>(SPI_processed);
}

void outbox_insert_message(const pg_uuid_t *message_id, Datum topic, Datum key, Datum payload,
                           Datum headers) {
    Oid types[5] = {UUIDOID, TEXTOID, TEXTOID, JSONBOID, JSONBOID};
    Datum values[5] = {UUIDPGetDatum(const_cast<pg_uuid_t *>(message_id)), topic, key, payload, headers};
    int rc = SPI_execute_plan(saved_plan(&insert_plan, outbox::sql::kInsertMessage, 5, types), values, nullptr, false, 0);
    if (rc != SPI_OK_INSERT)
        elog(ERROR, "pg outbox: inserting the message failed: %s", SPI_result_code_string(rc));
}
