#include "outbox/queries/spi.h"

extern "C" {
#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
}

namespace {

void prepare(OutboxQuery *q) {
    if (q->plan == nullptr) {
        // A generic plan, made once: the plan cache would otherwise plan
        // each call anew whenever it judges a custom plan cheaper, which
        // costs more than a small claim itself.  Every statement here is
        // written for its one right plan (an index scan, a TID scan).
        SPIPlanPtr plan = SPI_prepare_cursor(q->sql, q->nargs, q->argtypes, CURSOR_OPT_GENERIC_PLAN);
        if (plan == nullptr)
            elog(ERROR, "pg outbox: %s: preparing the statement failed: %s", q->what,
                 SPI_result_code_string(SPI_result));
        SPI_keepplan(plan);
        q->plan = plan;
    }
}

}  // namespace

uint64 outbox_run(OutboxQuery *q, const Datum *values, const char *nulls, long limit) {
    prepare(q);
    int rc = SPI_execute_plan(q->plan, const_cast<Datum *>(values), nulls, false, limit);
    if (rc != q->expected)
        elog(ERROR, "pg outbox: %s failed: %s", q->what, SPI_result_code_string(rc));
    return SPI_processed;
}

Portal outbox_open_cursor(OutboxQuery *q, const Datum *values, const char *nulls) {
    prepare(q);
    Portal portal = SPI_cursor_open(nullptr, q->plan, const_cast<Datum *>(values), nulls, false);
    if (portal == nullptr)
        elog(ERROR, "pg outbox: %s failed: %s", q->what, SPI_result_code_string(SPI_result));
    return portal;
}

Datum outbox_col(uint64 row, int column, bool *isnull) {
    return SPI_getbinval(SPI_tuptable->vals[row], SPI_tuptable->tupdesc, column, isnull);
}

char *outbox_col_text(uint64 row, int column) {
    return SPI_getvalue(SPI_tuptable->vals[row], SPI_tuptable->tupdesc, column);
}

Datum outbox_text_array(const char *const *values, const std::size_t *lengths, int n) {
    Datum *elems = static_cast<Datum *>(palloc(sizeof(Datum) * (n > 0 ? n : 1)));
    for (int i = 0; i < n; i++)
        elems[i] =
            PointerGetDatum(cstring_to_text_with_len(values[i], static_cast<int>(lengths[i])));
    return PointerGetDatum(construct_array(elems, n, TEXTOID, -1, false, TYPALIGN_INT));
}

Datum outbox_array(const Datum *elems, const bool *nulls, int n, Oid type) {
    int16 len;
    bool byval;
    char align;
    get_typlenbyvalalign(type, &len, &byval, &align);
    int dims[1] = {n};
    int lbs[1] = {1};
    return PointerGetDatum(construct_md_array(const_cast<Datum *>(elems), const_cast<bool *>(nulls),
                                              1, dims, lbs, type, len, byval, align));
}

Datum outbox_text_array_nullable(const char *const *values, int n) {
    Datum *elems = static_cast<Datum *>(palloc(sizeof(Datum) * (n > 0 ? n : 1)));
    bool *nulls = static_cast<bool *>(palloc(sizeof(bool) * (n > 0 ? n : 1)));
    for (int i = 0; i < n; i++) {
        nulls[i] = values[i] == nullptr;
        elems[i] = nulls[i] ? 0 : CStringGetTextDatum(values[i]);
    }
    return outbox_array(elems, nulls, n, TEXTOID);
}

Datum outbox_int8_array(const int64 *values, int n) {
    Datum *elems = static_cast<Datum *>(palloc(sizeof(Datum) * (n > 0 ? n : 1)));
    for (int i = 0; i < n; i++) elems[i] = Int64GetDatum(values[i]);
    return PointerGetDatum(
        construct_array(elems, n, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
}
