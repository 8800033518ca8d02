#include "outbox/outbox_queries.h"

extern "C" {
#include "catalog/pg_type.h"
#include "catalog/namespace.h"
#include "utils/lsyscache.h"
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
SPIPlanPtr inbox_insert_plan = nullptr;
SPIPlanPtr inbox_insert_raw_plan = nullptr;
SPIPlanPtr inbox_claim_plan = nullptr;
SPIPlanPtr inbox_keys_plan = nullptr;
SPIPlanPtr inbox_next_plan = nullptr;
SPIPlanPtr inbox_subs_plan = nullptr;
SPIPlanPtr inbox_done_plan = nullptr;
SPIPlanPtr inbox_failed_plan = nullptr;

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

namespace {

Datum text_or_null_array(const char *const *values, int n) {
    Datum *elems = static_cast<Datum *>(palloc(sizeof(Datum) * (n > 0 ? n : 1)));
    bool *nulls = static_cast<bool *>(palloc(sizeof(bool) * (n > 0 ? n : 1)));
    for (int i = 0; i < n; i++) {
        nulls[i] = values[i] == nullptr;
        elems[i] = nulls[i] ? 0 : CStringGetTextDatum(values[i]);
    }
    int dims[1] = {n};
    int lbs[1] = {1};
    return PointerGetDatum(
        construct_md_array(elems, nulls, 1, dims, lbs, TEXTOID, -1, false, TYPALIGN_INT));
}

}  // namespace

int64 outbox_inbox_insert(const OutboxInboxRow *rows, int n) {
    const char **event_ids = static_cast<const char **>(palloc(sizeof(char *) * n));
    const char **topics = static_cast<const char **>(palloc(sizeof(char *) * n));
    const char **keys = static_cast<const char **>(palloc(sizeof(char *) * n));
    const char **payloads = static_cast<const char **>(palloc(sizeof(char *) * n));
    const char **headers = static_cast<const char **>(palloc(sizeof(char *) * n));
    Datum *partitions = static_cast<Datum *>(palloc(sizeof(Datum) * n));
    Datum *offsets = static_cast<Datum *>(palloc(sizeof(Datum) * n));
    for (int i = 0; i < n; i++) {
        event_ids[i] = rows[i].event_id;
        topics[i] = rows[i].topic;
        keys[i] = rows[i].key;
        payloads[i] = rows[i].payload;
        headers[i] = rows[i].headers;
        partitions[i] = Int32GetDatum(rows[i].partition);
        offsets[i] = Int64GetDatum(rows[i].offset);
    }
    Oid types[7] = {TEXTARRAYOID, TEXTARRAYOID, TEXTARRAYOID, TEXTARRAYOID,
                    TEXTARRAYOID, INT4ARRAYOID, INT8ARRAYOID};
    Datum values[7] = {
        text_or_null_array(event_ids, n), text_or_null_array(topics, n),
        text_or_null_array(keys, n),      text_or_null_array(payloads, n),
        text_or_null_array(headers, n),
        PointerGetDatum(construct_array(partitions, n, INT4OID, 4, true, TYPALIGN_INT)),
        PointerGetDatum(construct_array(offsets, n, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE))};
    int rc = SPI_execute_plan(saved_plan(&inbox_insert_plan, outbox::sql::kInboxInsert, 7, types),
                              values, nullptr, false, 0);
    if (rc != SPI_OK_INSERT)
        elog(ERROR, "pg outbox: storing inbox records failed: %s", SPI_result_code_string(rc));
    return static_cast<int64>(SPI_processed);
}

int64 outbox_inbox_insert_raw(const OutboxInboxRow *row) {
    Oid types[7] = {TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, INT4OID, INT8OID};
    Datum values[7] = {row->event_id ? CStringGetTextDatum(row->event_id) : 0,
                       CStringGetTextDatum(row->topic),
                       row->key ? CStringGetTextDatum(row->key) : 0,
                       CStringGetTextDatum(row->payload),
                       CStringGetTextDatum(row->headers),
                       Int32GetDatum(row->partition),
                       Int64GetDatum(row->offset)};
    char nulls[7] = {row->event_id ? ' ' : 'n', ' ', row->key ? ' ' : 'n', ' ', ' ', ' ', ' '};
    int rc = SPI_execute_plan(
        saved_plan(&inbox_insert_raw_plan, outbox::sql::kInboxInsertRaw, 7, types), values, nulls,
        false, 0);
    if (rc != SPI_OK_INSERT)
        elog(ERROR, "pg outbox: storing an inbox record failed: %s", SPI_result_code_string(rc));
    return static_cast<int64>(SPI_processed);
}

bool outbox_inbox_ready(void) {
    Oid nsp = get_namespace_oid("outbox", true);
    return OidIsValid(nsp) && OidIsValid(get_relname_relid("inbox_subscription", nsp));
}

void outbox_inbox_subscriptions(char ***topics, Oid **handlers, Oid **run_as, int *n) {
    int rc = SPI_execute_plan(saved_plan(&inbox_subs_plan, outbox::sql::kInboxSubscriptions, 0,
                                         nullptr),
                              nullptr, nullptr, false, 0);
    if (rc != SPI_OK_SELECT)
        elog(ERROR, "pg outbox: reading inbox subscriptions failed: %s", SPI_result_code_string(rc));
    *n = static_cast<int>(SPI_processed);
    *topics = static_cast<char **>(palloc(sizeof(char *) * (*n + 1)));
    *handlers = static_cast<Oid *>(palloc(sizeof(Oid) * (*n + 1)));
    *run_as = static_cast<Oid *>(palloc(sizeof(Oid) * (*n + 1)));
    for (int i = 0; i < *n; i++) {
        HeapTuple tup = SPI_tuptable->vals[i];
        TupleDesc desc = SPI_tuptable->tupdesc;
        bool isnull;
        (*topics)[i] = SPI_getvalue(tup, desc, 1);
        (*handlers)[i] = DatumGetObjectId(SPI_getbinval(tup, desc, 2, &isnull));
        (*run_as)[i] = DatumGetObjectId(SPI_getbinval(tup, desc, 3, &isnull));
    }
}

char **outbox_inbox_retrying_keys(int *n) {
    int rc = SPI_execute_plan(saved_plan(&inbox_keys_plan, outbox::sql::kInboxRetryingKeys, 0,
                                         nullptr),
                              nullptr, nullptr, false, 0);
    if (rc != SPI_OK_SELECT)
        elog(ERROR, "pg outbox: reading retrying inbox keys failed: %s", SPI_result_code_string(rc));
    *n = static_cast<int>(SPI_processed);
    char **keys = static_cast<char **>(palloc(sizeof(char *) * (*n + 1)));
    for (int i = 0; i < *n; i++) keys[i] = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
    return keys;
}

int outbox_inbox_claim(int limit, char **topics, int ntopics, char **blocked, int nblocked,
                       OutboxInboxClaim **rows) {
    std::size_t *tlen = static_cast<std::size_t *>(palloc(sizeof(std::size_t) * (ntopics + 1)));
    for (int i = 0; i < ntopics; i++) tlen[i] = strlen(topics[i]);
    std::size_t *blen = static_cast<std::size_t *>(palloc(sizeof(std::size_t) * (nblocked + 1)));
    for (int i = 0; i < nblocked; i++) blen[i] = strlen(blocked[i]);
    Oid types[3] = {INT4OID, TEXTARRAYOID, TEXTARRAYOID};
    Datum values[3] = {Int32GetDatum(limit), outbox_text_array(topics, tlen, ntopics),
                       outbox_text_array(blocked, blen, nblocked)};
    int rc = SPI_execute_plan(saved_plan(&inbox_claim_plan, outbox::sql::kInboxClaim, 3, types),
                              values, nullptr, false, limit);
    if (rc != SPI_OK_SELECT)
        elog(ERROR, "pg outbox: claiming inbox records failed: %s", SPI_result_code_string(rc));
    int n = static_cast<int>(SPI_processed);
    auto *out = static_cast<OutboxInboxClaim *>(palloc(sizeof(OutboxInboxClaim) * (n + 1)));
    TupleDesc desc = SPI_tuptable->tupdesc;
    for (int i = 0; i < n; i++) {
        HeapTuple tup = SPI_tuptable->vals[i];
        bool isnull;
        out[i].row = SPI_getbinval(tup, desc, 1, &isnull);
        out[i].event_id = SPI_getbinval(tup, desc, 2, &isnull);
        out[i].topic = SPI_getvalue(tup, desc, 3);
        out[i].key = SPI_getvalue(tup, desc, 4);  // NULL stays nullptr
    }
    *rows = out;
    return n;
}

void outbox_inbox_done(Datum event_id) {
    Oid types[1] = {UUIDOID};
    Datum values[1] = {event_id};
    int rc = SPI_execute_plan(saved_plan(&inbox_done_plan, outbox::sql::kInboxDone, 1, types),
                              values, nullptr, false, 0);
    if (rc != SPI_OK_UPDATE)
        elog(ERROR, "pg outbox: marking an inbox record processed failed: %s",
             SPI_result_code_string(rc));
}

bool outbox_inbox_failed(Datum event_id, const char *error, int max_attempts) {
    Oid types[3] = {UUIDOID, TEXTOID, INT4OID};
    Datum values[3] = {event_id, CStringGetTextDatum(error), Int32GetDatum(max_attempts)};
    int rc = SPI_execute_plan(saved_plan(&inbox_failed_plan, outbox::sql::kInboxFailed, 3, types),
                              values, nullptr, false, 0);
    if (rc != SPI_OK_UPDATE_RETURNING)
        elog(ERROR, "pg outbox: recording a failed handler call failed: %s",
             SPI_result_code_string(rc));
    bool isnull;
    return SPI_processed > 0 &&
           DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}

TimestampTz outbox_inbox_next_retry(void) {
    int rc = SPI_execute_plan(saved_plan(&inbox_next_plan, outbox::sql::kInboxNextRetry, 0, nullptr),
                              nullptr, nullptr, false, 0);
    if (rc != SPI_OK_SELECT)
        elog(ERROR, "pg outbox: reading inbox retries failed: %s", SPI_result_code_string(rc));
    bool isnull = true;
    Datum d = SPI_processed > 0
                  ? SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)
                  : 0;
    return isnull ? 0 : DatumGetTimestampTz(d);
}

void outbox_insert_message(const pg_uuid_t *message_id, Datum topic, Datum key, Datum payload,
                           Datum headers) {
    Oid types[5] = {UUIDOID, TEXTOID, TEXTOID, JSONBOID, JSONBOID};
    Datum values[5] = {UUIDPGetDatum(const_cast<pg_uuid_t *>(message_id)), topic, key, payload, headers};
    int rc = SPI_execute_plan(saved_plan(&insert_plan, outbox::sql::kInsertMessage, 5, types), values, nullptr, false, 0);
    if (rc != SPI_OK_INSERT)
        elog(ERROR, "pg outbox: inserting the message failed: %s", SPI_result_code_string(rc));
}
