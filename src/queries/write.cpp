#include "outbox/queries/write.h"

#include "outbox/queries/spi.h"
#include "outbox/queries/write_sql.h"

extern "C" {
#include "catalog/pg_type.h"
#include "storage/lock.h"
}

namespace sql = outbox::sql::write;

namespace {

OutboxQuery insert_query = {
    "inserting the message", sql::kInsert, 5, {UUIDOID, TEXTOID, TEXTOID, JSONBOID, JSONBOID},
    SPI_OK_INSERT_RETURNING, nullptr};
OutboxQuery insert_full_query = {
    "inserting the message", sql::kInsertFull, 9,
    {UUIDOID, TEXTOID, TEXTOID, JSONBOID, JSONBOID, INT4OID, BOOLOID, BYTEAOID, BYTEAOID},
    SPI_OK_INSERT_RETURNING, nullptr};
OutboxQuery heal_query = {"checking the id sequence", sql::kHealSequence, 0, {}, SPI_OK_SELECT,
                          nullptr};

// Advisory lock key of the heal: ('ob', 'x1') in the two-int4 space.
constexpr uint32 kHealKey1 = 0x6f62;
constexpr uint32 kHealKey2 = 0x7831;

}  // namespace

int64 outbox_insert_message(const OutboxNewMessage *m) {
    bool full = m->has_partition || m->is_binary;
    Datum values[9] = {UUIDPGetDatum(const_cast<pg_uuid_t *>(m->message_id)),
                       m->topic,
                       m->key,
                       m->payload,
                       m->headers,
                       Int32GetDatum(m->partition),
                       BoolGetDatum(m->is_binary),
                       m->key_bytes,
                       m->value};
    char nulls[9] = {' ', ' ', m->keyless ? 'n' : ' ', ' ', ' ', m->has_partition ? ' ' : 'n', ' ',
                     m->has_key_bytes ? ' ' : 'n', m->has_value ? ' ' : 'n'};
    outbox_run(full ? &insert_full_query : &insert_query, values, nulls, 0);
    bool isnull;
    return DatumGetInt64(outbox_col(0, 1, &isnull));
}

bool outbox_heal_id_sequence(void) {
    LOCKTAG tag;
    SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, kHealKey1, kHealKey2, 2);
    // Never wait: any role may take this advisory lock with
    // pg_advisory_lock() and keep it.  While another backend holds it, this
    // one skips the check and tries again at its next write.
    if (LockAcquire(&tag, ExclusiveLock, true, true) == LOCKACQUIRE_NOT_AVAIL) return false;
    PG_TRY();
    {
        if (outbox_run(&heal_query, nullptr, nullptr, 0) > 0)
            ereport(LOG, (errmsg("pg outbox: the message id sequence was behind the table "
                                 "(restored from a dump that did not carry it); moved it past "
                                 "the highest id")));
    }
    PG_FINALLY();
    {
        LockRelease(&tag, ExclusiveLock, true);
    }
    PG_END_TRY();
    return true;
}
