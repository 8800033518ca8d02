#include "outbox/queries/relay.h"

#include "outbox/common/hex.h"
#include "outbox/policy.h"

#include "outbox/encoding.h"
#include "outbox/guc.h"
#include "outbox/queries/relay_sql.h"
#include "outbox/queries/spi.h"
#include "outbox/worker_common.h"

extern "C" {
#include "access/detoast.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "mb/pg_wchar.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/uuid.h"
#include "catalog/dependency.h"
#include "catalog/namespace.h"
#include "utils/lsyscache.h"
}

namespace sql = outbox::sql::relay;

namespace {

OutboxQuery claim_query = {
    "claiming pending messages", sql::kClaim, 6,
    {INT4OID, TEXTARRAYOID, INT4OID, INT4OID, INT8OID, BOOLOID}, SPI_OK_SELECT, nullptr};
OutboxQuery claim_query_before_13 = {
    "claiming pending messages", sql::kClaimBefore13, 5,
    {INT4OID, TEXTARRAYOID, INT4OID, INT4OID, INT8OID}, SPI_OK_SELECT, nullptr};
OutboxQuery claim_query_before_12 = {
    "claiming pending messages", sql::kClaimBefore12, 5,
    {INT4OID, TEXTARRAYOID, INT4OID, INT4OID, INT8OID}, SPI_OK_SELECT, nullptr};
OutboxQuery first_pending_query = {
    "finding the first pending message", sql::kFirstPending, 2, {INT8OID, BOOLOID},
    SPI_OK_SELECT, nullptr};
OutboxQuery first_pending_query_before_13 = {
    "finding the first pending message", sql::kFirstPendingBefore13, 1, {INT8OID},
    SPI_OK_SELECT, nullptr};
OutboxQuery next_retry_query = {
    "finding the next retry", sql::kNextRetry, 0, {}, SPI_OK_SELECT, nullptr};
OutboxQuery first_due_query = {
    "finding the retries due", sql::kFirstDue, 0, {}, SPI_OK_SELECT, nullptr};
OutboxQuery mark_claimed_query = {
    "marking messages published", sql::kMarkClaimedPublished, 1, {TIDARRAYOID}, SPI_OK_UPDATE,
    nullptr};
OutboxQuery mark_by_id_query = {
    "marking messages published", sql::kMarkPublished, 1, {INT8ARRAYOID}, SPI_OK_UPDATE, nullptr};
OutboxQuery mark_claimed_at_query = {
    "marking messages published", sql::kMarkClaimedPublishedAt, 3,
    {TIDARRAYOID, INT4ARRAYOID, INT8ARRAYOID}, SPI_OK_UPDATE, nullptr};
OutboxQuery mark_by_id_at_query = {
    "marking messages published", sql::kMarkPublishedAt, 3,
    {INT8ARRAYOID, INT4ARRAYOID, INT8ARRAYOID}, SPI_OK_UPDATE, nullptr};
OutboxQuery failures_query = {
    "recording failed deliveries", sql::kRecordFailures, 7,
    {INT8ARRAYOID, TEXTOID, BOOLOID, INT4OID, BOOLOID, FLOAT8OID, FLOAT8OID},
    SPI_OK_UPDATE_RETURNING, nullptr};
OutboxQuery failures_query_before_13 = {
    "recording failed deliveries", sql::kRecordFailuresBefore13, 5,
    {INT8ARRAYOID, TEXTOID, BOOLOID, INT4OID, BOOLOID}, SPI_OK_UPDATE_RETURNING, nullptr};

// Payloads bigger than this (as jsonb) are rendered in a subtransaction: one
// too big to render (its text past 1 GB) is parked instead of failing the
// whole claim again and again.
constexpr Size kRenderGuardBytes = 16 * 1024 * 1024;

const char *text_bytes(Datum d, std::size_t *len) {
    text *t = reinterpret_cast<text *>(pg_detoast_datum_packed(
        reinterpret_cast<varlena *>(DatumGetPointer(d))));
    *len = VARSIZE_ANY_EXHDR(t);
    return VARDATA_ANY(t);
}

char *jsonb_text(Datum d, std::size_t *len) {
    Jsonb *jb = DatumGetJsonbP(d);
    char *out = JsonbToCString(nullptr, &jb->root, VARSIZE(jb));
    *len = strlen(out);
    return out;
}

struct Render {
    Datum jsonb;
    char *text;
    std::size_t len;
};

void render_call(void *arg) {
    auto *r = static_cast<Render *>(arg);
    r->text = jsonb_text(r->jsonb, &r->len);
}

// The JSON text of a jsonb column of the row.  One bigger than
// kRenderGuardBytes is rendered in a subtransaction, so that one too big to
// render gives `error` (for parking) instead of failing every claim.
char *render_json(Datum d, const char *what, std::size_t *len, char **error) {
    Size raw = toast_raw_datum_size(d);
    if (raw <= kRenderGuardBytes) return jsonb_text(d, len);
    Render render{d, nullptr, 0};
    char *reason = nullptr;
    if (outbox_worker_subtransaction(render_call, &render, &reason)) {
        *len = render.len;
        return render.text;
    }
    *error = psprintf("the %s (%lld bytes as jsonb) cannot be rendered as JSON text: %s", what,
                      static_cast<long long>(raw), reason);
    *len = 0;
    return pstrdup("");
}

// `text` in UTF-8, or an error naming `what` for parking.
const char *utf8_or_error(const char *text, std::size_t *len, const char *what, char **error) {
    if (*error) return text;
    const char *out = outbox_encoding_to_utf8(text, len);
    if (out) return out;
    *error = psprintf("the %s holds a character that has no equivalent in UTF-8 (database "
                      "encoding %s)",
                      what, GetDatabaseEncodingName());
    *len = 0;
    return "";
}

void format_uuid(const pg_uuid_t *u, char *out) {
    int o = 0;
    for (int i = 0; i < UUID_LEN; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10) out[o++] = '-';
        outbox::hex::encode(&u->data[i], 1, out + o);
        o += 2;
    }
    out[o] = '\0';
}

}  // namespace

void outbox_relay_claim(int schema, int limit, int64 low_water, OutboxShare share,
                        Datum skip_keys, bool waiting, int64 byte_budget, OutboxClaim *out) {
    Datum values[6] = {Int32GetDatum(limit),       skip_keys,
                       Int32GetDatum(share.count), Int32GetDatum(share.index),
                       Int64GetDatum(low_water),   BoolGetDatum(!waiting)};
    OutboxQuery *q = schema >= kOutboxSchema13   ? &claim_query
                     : schema >= kOutboxSchema12 ? &claim_query_before_13
                                                 : &claim_query_before_12;
    int n = static_cast<int>(outbox_run(q, values, nullptr, limit));
    out->n = 0;
    out->left = 0;
    out->records = static_cast<outbox::kafka::Record *>(
        palloc0(sizeof(outbox::kafka::Record) * (n > 0 ? n : 1)));
    out->ctids = static_cast<ItemPointerData *>(palloc(sizeof(ItemPointerData) * (n > 0 ? n : 1)));
    if (n == 0) return;

    SPITupleTable *tuples = SPI_tuptable;  // a subtransaction below must not lose it
    char *event_ids = static_cast<char *>(palloc(static_cast<Size>(n) * (UUID_LEN * 2 + 5)));
    int64 used = 0;
    for (int i = 0; i < n; i++) {
        SPI_tuptable = tuples;
        bool isnull;
        bool is_binary = DatumGetBool(outbox_col(i, sql::kClaimIsBinary, &isnull));
        Datum value = outbox_col(i, is_binary ? sql::kClaimValue : sql::kClaimPayload, &isnull);
        bool has_value = !isnull;
        int64 raw = has_value ? static_cast<int64>(toast_raw_datum_size(value)) : 0;
        Datum headers = outbox_col(i, sql::kClaimHeaders, &isnull);
        bool key_null;
        Datum key = outbox_col(i, sql::kClaimKey, &key_null);
        int64 bytes = raw + static_cast<int64>(toast_raw_datum_size(headers)) +
                      (key_null ? 0 : static_cast<int64>(toast_raw_datum_size(key)));
        if (i > 0 && used + bytes > byte_budget) {
            out->left = n - i;
            break;
        }
        used += bytes;

        outbox::kafka::Record &r = out->records[i];
        r.id = DatumGetInt64(outbox_col(i, sql::kClaimId, &isnull));
        char *eid = event_ids + static_cast<Size>(i) * (UUID_LEN * 2 + 5);
        format_uuid(DatumGetUUIDP(outbox_col(i, sql::kClaimMessageId, &isnull)), eid);
        r.event_id = eid;
        r.topic = text_bytes(outbox_col(i, sql::kClaimTopic, &isnull), &r.topic_len);
        // The order key is "topic key", as the claim compares it: a key's
        // order is per topic.  Keyless rows (key NULL) have none.
        std::size_t key_text_len = 0;
        const char *key_text = key_null ? nullptr : text_bytes(key, &key_text_len);
        if (key_text) {
            char *ok = static_cast<char *>(palloc(r.topic_len + 1 + key_text_len + 1));
            memcpy(ok, r.topic, r.topic_len);
            ok[r.topic_len] = ' ';
            memcpy(ok + r.topic_len + 1, key_text, key_text_len);
            ok[r.topic_len + 1 + key_text_len] = '\0';
            r.order_key = ok;
            r.order_key_len = r.topic_len + 1 + key_text_len;
        } else {
            r.order_key = nullptr;
            r.order_key_len = 0;
        }
        Datum p = outbox_col(i, sql::kClaimPartition, &isnull);
        r.partition = isnull ? -1 : DatumGetInt32(p);
        char *error = nullptr;
        r.headers = render_json(headers, "headers", &r.headers_len, &error);
        r.headers = utf8_or_error(r.headers, &r.headers_len, "headers", &error);
        if (is_binary) {
            // Bytes, exactly as written: no conversion.
            Datum k = outbox_col(i, sql::kClaimKeyBytes, &isnull);
            if (!isnull) {
                r.key = text_bytes(k, &r.key_len);
            } else {
                r.key = nullptr;
                r.order_key = nullptr;  // no key: nothing to keep in order
            }
            if (has_value) r.value = text_bytes(value, &r.value_len);
        } else {
            r.key_len = key_text_len;
            r.key = utf8_or_error(key_text ? key_text : "", &r.key_len, "key", &error);
            r.value = render_json(value, "payload", &r.value_len, &error);
            r.value = utf8_or_error(r.value, &r.value_len, "payload", &error);
        }
        // A row on the progress topic (written before outbox.progress_topic
        // named it, or not through outbox.write): sent, it could become a
        // relay's last progress record and stop that relay.  Parked.
        if (!error && outbox_is_progress_topic(r.topic, r.topic_len))
            error = psprintf("the topic is outbox.progress_topic, where exactly-once relays "
                             "record their progress; such a message could stop them");
        r.error = error;
        if (error) r.value = "";
        bool ctid_null;
        ItemPointerCopy(reinterpret_cast<ItemPointer>(
                            DatumGetPointer(outbox_col(i, sql::kClaimCtid, &ctid_null))),
                        &out->ctids[i]);
        out->n = i + 1;
    }
    SPI_tuptable = tuples;
}

int64 outbox_relay_first_pending(int schema, int64 from, bool waiting) {
    Datum values[2] = {Int64GetDatum(from), BoolGetDatum(!waiting)};
    OutboxQuery *q =
        schema >= kOutboxSchema13 ? &first_pending_query : &first_pending_query_before_13;
    if (outbox_run(q, values, nullptr, 1) == 0) return -1;
    bool isnull;
    return DatumGetInt64(outbox_col(0, 1, &isnull));
}

TimestampTz outbox_relay_next_retry(void) {
    outbox_run(&next_retry_query, nullptr, nullptr, 1);
    bool isnull = true;
    Datum d = outbox_col(0, 1, &isnull);
    return isnull ? 0 : DatumGetTimestampTz(d);
}

int64 outbox_relay_first_due(void) {
    outbox_run(&first_due_query, nullptr, nullptr, 1);
    bool isnull = true;
    Datum d = outbox_col(0, 1, &isnull);
    return isnull ? -1 : DatumGetInt64(d);
}

int64 outbox_relay_last_id(void) {
    Oid nsp = get_namespace_oid("outbox", false);
    Oid rel = get_relname_relid("outbox_message", nsp);
    Oid seq = OidIsValid(rel) ? outbox::pg::identity_sequence(rel, 1) : InvalidOid;
    if (!OidIsValid(seq)) return 0;
    LOCAL_FCINFO(fcinfo, 1);
    InitFunctionCallInfoData(*fcinfo, nullptr, 1, InvalidOid, nullptr, nullptr);
    fcinfo->args[0].value = ObjectIdGetDatum(seq);
    fcinfo->args[0].isnull = false;
    Datum v = pg_sequence_last_value(fcinfo);
    return fcinfo->isnull ? 0 : DatumGetInt64(v);
}

namespace {
// The partitions and offsets of a mark, as int4[] and int8[] datums.
void mark_places(const OutboxPlaces *at, int n, Datum *values) {
    Datum *parts = static_cast<Datum *>(palloc(sizeof(Datum) * n));
    for (int i = 0; i < n; i++) parts[i] = Int32GetDatum(at->partitions[i]);
    values[1] = outbox_array(parts, nullptr, n, INT4OID);
    values[2] = outbox_int8_array(at->offsets, n);
}
}  // namespace

void outbox_relay_mark_claimed(const ItemPointerData *ctids, const OutboxPlaces *at, int n) {
    if (n == 0) return;
    Datum *elems = static_cast<Datum *>(palloc(sizeof(Datum) * n));
    for (int i = 0; i < n; i++) elems[i] = PointerGetDatum(&ctids[i]);
    Datum values[3] = {PointerGetDatum(construct_array(elems, n, TIDOID, sizeof(ItemPointerData),
                                                       false, TYPALIGN_SHORT))};
    if (at) mark_places(at, n, values);
    SetCurrentStatementStartTimestamp();
    uint64 marked = outbox_run(at ? &mark_claimed_at_query : &mark_claimed_query, values, nullptr, 0);
    if (marked != static_cast<uint64>(n))
        elog(WARNING, "pg outbox: marked %llu of %d acknowledged rows published",
             static_cast<unsigned long long>(marked), n);
}

void outbox_relay_mark_by_id(const int64 *ids, const OutboxPlaces *at, int n) {
    if (n == 0) return;
    Datum values[3] = {outbox_int8_array(ids, n)};
    if (at) mark_places(at, n, values);
    SetCurrentStatementStartTimestamp();
    outbox_run(at ? &mark_by_id_at_query : &mark_by_id_query, values, nullptr, 0);
}

namespace {

// The failures of a batch, ordered so that those alike are next to each
// other (qsort's comparator sees them through this).
struct FailureOrder {
    const char *const *errors;
    const bool *permanent;
    const bool *park_now;
};
const FailureOrder *failure_order;

int compare_failures(const void *a, const void *b) {
    int i = *static_cast<const int *>(a), j = *static_cast<const int *>(b);
    const FailureOrder &o = *failure_order;
    if (o.permanent[i] != o.permanent[j]) return o.permanent[i] ? 1 : -1;
    if (o.park_now[i] != o.park_now[j]) return o.park_now[i] ? 1 : -1;
    int c = strcmp(o.errors[i], o.errors[j]);
    return c != 0 ? c : (i < j ? -1 : i > j);
}

// Records one kind of failure on `n` rows; logs each row parked now (rare,
// never the payload).  Returns how many it parked.
int record_failure_kind(int schema, const int64 *ids, int n, const char *error, bool permanent,
                        bool park_now, int max_attempts, const char *label, int64 *first_parked,
                        TimestampTz *next_due) {
    Datum values[7] = {outbox_int8_array(ids, n),
                       CStringGetTextDatum(error),
                       BoolGetDatum(permanent),
                       Int32GetDatum(max_attempts),
                       BoolGetDatum(park_now),
                       Float8GetDatum(outbox::policy::kRefusedRetryBaseSeconds),
                       Float8GetDatum(outbox::policy::kRefusedRetryCapSeconds)};
    uint64 rows = outbox_run(schema >= kOutboxSchema13 ? &failures_query : &failures_query_before_13,
                             values, nullptr, 0);
    int parked = 0;
    for (uint64 i = 0; i < rows; i++) {
        bool isnull;
        Datum waits = outbox_col(i, sql::kFailureWaits, &isnull);
        if (!isnull) {
            const Interval *span = DatumGetIntervalP(waits);
            TimestampTz due = GetCurrentStatementStartTimestamp() + span->time +
                              static_cast<int64>(span->day) * USECS_PER_DAY;
            if (*next_due == 0 || due < *next_due) *next_due = due;
        }
        if (!DatumGetBool(outbox_col(i, sql::kFailureParkedNow, &isnull))) continue;
        int64 id = DatumGetInt64(outbox_col(i, sql::kFailureId, &isnull));
        *first_parked = Min(*first_parked, id);
        parked++;
        ereport(WARNING,
                (errmsg("%s: parked message %s (topic \"%s\") after %s failed attempts", label,
                        outbox_col_text(i, sql::kFailureMessageId),
                        outbox_col_text(i, sql::kFailureTopic),
                        outbox_col_text(i, sql::kFailureAttempts)),
                 errdetail("Last error: %s", outbox_col_text(i, sql::kFailureError)),
                 errhint("See outbox.parked_messages; outbox.retry(message_id) puts it back.")));
    }
    return parked;
}

}  // namespace

int outbox_relay_record_failures(int schema, const int64 *ids, const char *const *errors,
                                 const bool *permanent, const bool *park_now, int n,
                                 int max_attempts, const char *label, int64 *first_parked,
                                 TimestampTz *next_due) {
    if (n == 0) return 0;
    int *order = static_cast<int *>(palloc(sizeof(int) * n));
    for (int i = 0; i < n; i++) order[i] = i;
    FailureOrder o{errors, permanent, park_now};
    failure_order = &o;
    qsort(order, static_cast<size_t>(n), sizeof(int), compare_failures);
    int64 *group = static_cast<int64 *>(palloc(sizeof(int64) * n));
    int parked = 0;
    for (int start = 0; start < n;) {
        int first = order[start], len = 0;
        int end = start;
        while (end < n && permanent[order[end]] == permanent[first] &&
               park_now[order[end]] == park_now[first] &&
               strcmp(errors[order[end]], errors[first]) == 0)
            group[len++] = ids[order[end++]];
        parked += record_failure_kind(schema, group, len, errors[first], permanent[first],
                                      park_now[first], max_attempts, label, first_parked, next_due);
        start = end;
    }
    return parked;
}
