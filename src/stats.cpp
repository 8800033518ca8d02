// outbox._worker_stats(): the counters of every worker's shared memory
// slot, read without touching any table.  The views outbox.worker_stats and
// outbox.stats (outbox--1.0--1.1.sql) are built on it.
#include "outbox/pg.h"

#include "outbox/shmem.h"
#include "outbox/workers.h"

extern "C" {
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
}

namespace {

const char *broker_state_name(int state) {
    switch (state) {
        case OUTBOX_BROKER_UP: return "up";
        case OUTBOX_BROKER_DOWN: return "down";
        default: return "unknown";
    }
}

Datum timestamp_or_null(TimestampTz t, bool *isnull) {
    *isnull = t == 0;
    return TimestampTzGetDatum(t);
}

}  // namespace

extern "C" {

PGDLLEXPORT Datum outbox_worker_stats(PG_FUNCTION_ARGS);
PG_FUNCTION_INFO_V1(outbox_worker_stats);

Datum outbox_worker_stats(PG_FUNCTION_ARGS) {
    InitMaterializedSRF(fcinfo, 0);
    ReturnSetInfo *rsinfo = reinterpret_cast<ReturnSetInfo *>(fcinfo->resultinfo);
    // 16 columns from schema 1.4 (waiting_for); a 1.3 schema's function
    // asks for the first 15, and gets them.
    constexpr int kColumns = 16;
    for (int i = 0; i < outbox_slot_count(); i++) {
        OutboxSlotStats st;
        if (!outbox_slot_stats(i, &st)) continue;
        Datum values[kColumns];
        bool nulls[kColumns] = {};
        values[0] = CStringGetTextDatum(outbox_role_name(st.role));
        values[1] = Int32GetDatum(st.share + 1);
        char *dbname = get_database_name(st.database);
        nulls[2] = dbname == nullptr;
        values[2] = dbname ? CStringGetTextDatum(dbname) : 0;
        values[3] = Int32GetDatum(st.pid);
        values[4] = timestamp_or_null(st.started_at, &nulls[4]);
        values[5] = timestamp_or_null(st.last_activity_at, &nulls[5]);
        values[6] = Int64GetDatum(static_cast<int64>(st.processed));
        values[7] = Int64GetDatum(static_cast<int64>(st.processed_last_minute));
        values[8] = Int64GetDatum(static_cast<int64>(st.failed));
        values[9] = Int64GetDatum(static_cast<int64>(st.parked));
        values[10] = Int64GetDatum(static_cast<int64>(st.batches));
        values[11] = Int64GetDatum(static_cast<int64>(st.in_flight));
        bool talks_to_kafka = st.role == OUTBOX_ROLE_RELAY || st.role == OUTBOX_ROLE_INBOX_CONSUMER;
        nulls[12] = !talks_to_kafka;
        values[12] = CStringGetTextDatum(broker_state_name(st.broker_state));
        nulls[13] = st.last_error[0] == '\0';
        values[13] = CStringGetTextDatum(st.last_error);
        values[14] = timestamp_or_null(st.last_error_at, &nulls[14]);
        nulls[15] = st.waiting_for[0] == '\0';
        values[15] = CStringGetTextDatum(st.waiting_for);
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
    }
    return static_cast<Datum>(0);
}

}  // extern "C"
