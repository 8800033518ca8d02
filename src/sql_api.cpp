// SQL-callable functions written in C++: outbox.write(), write_bytes(),
// confluent_frame() and the small internal helpers.  (mark_processed,
// is_processed and the inbox's SQL side are SQL/plpgsql in the schema.)
#include "outbox/pg.h"

#include "outbox/common/hex.h"
#include "outbox/common/topic.h"
#include "outbox/sql_args.h"
#include "outbox/encoding.h"
#include "outbox/guc.h"
#include "outbox/low_water.h"
#include "outbox/policy.h"
#include "outbox/queries/write.h"
#include "outbox/shmem.h"
#include "outbox/wakeup.h"
#include "outbox/worker_common.h"
#include "outbox/workers.h"

extern "C" {
#include "access/detoast.h"
#include "catalog/namespace.h"
#include "executor/spi.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"
}

namespace {

const char *jsonb_value_word(const JsonbValue &v) {
    switch (v.type) {
        case jbvNull: return "null";
        case jbvString: return "a string";
        case jbvNumeric: return "a number";
        case jbvBool: return "a boolean";
        case jbvBinary: return "an object or array";
        default: return "not a string";
    }
}

// Kafka headers are name -> bytes; we take a flat JSON object of strings.
void check_headers(const char *function, Jsonb *headers) {
    if (!JB_ROOT_IS_OBJECT(headers)) {
        const char *what = "an array";
        JsonbValue scalar;
        if (JB_ROOT_IS_SCALAR(headers) && JsonbExtractScalar(&headers->root, &scalar))
            what = jsonb_value_word(scalar);
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("%s: headers must be a JSON object of strings", function),
                        errdetail("The headers are %s.", what)));
    }
    JsonbIterator *it = JsonbIteratorInit(&headers->root);
    JsonbValue v;
    JsonbIteratorToken tok;
    char *name = nullptr;
    while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE) {
        if (tok == WJB_KEY) {
            name = pnstrdup(v.val.string.val, v.val.string.len);
        } else if (tok == WJB_VALUE && v.type != jbvString) {
            ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                            errmsg("%s: headers must be a JSON object of strings", function),
                            errdetail("Header \"%s\" is %s.", name ? name : "?",
                                      jsonb_value_word(v))));
        }
    }
}

// The message's headers: its own over the session's outbox.default_headers
// (checked when set: a JSON object of strings).  The parsed defaults are
// kept while the setting's text stays the same.
Datum merged_headers(Datum own) {
    const char *defaults = outbox_default_headers ? outbox_default_headers : "";
    if (defaults[0] == '\0') return own;
    static char *cached_text = nullptr;
    static Datum cached = 0;
    if (!cached_text || strcmp(cached_text, defaults) != 0) {
        MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
        // Each message's event_id is its own: never the setting's (its check
        // refuses one; this keeps it so whatever the setting holds).
        Datum parsed = DirectFunctionCall2(
            jsonb_delete, DirectFunctionCall1(jsonb_in, CStringGetDatum(defaults)),
            CStringGetTextDatum("event_id"));
        char *text_copy = pstrdup(defaults);
        MemoryContextSwitchTo(old);
        if (cached_text) {
            pfree(cached_text);
            pfree(DatumGetPointer(cached));
        }
        cached_text = text_copy;
        cached = parsed;
    }
    return DirectFunctionCall2(jsonb_concat, cached, own);
}

void check_partition(const char *function, FunctionCallInfo fcinfo, int arg, bool *has,
                     int32 *partition) {
    *has = PG_NARGS() > arg && !PG_ARGISNULL(arg);
    *partition = *has ? PG_GETARG_INT32(arg) : -1;
    if (*has && *partition < 0)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("%s: partition must be NULL or at least 0, got %d", function,
                               *partition)));
}

// Kafka's message.max.bytes bounds a whole record; we hold its value, its
// key and its headers each to outbox.max_message_bytes, so that no row
// write() takes can outgrow what the relay renders and sends.
[[noreturn]] void too_large(const char *function, const char *what, int64 bytes) {
    ereport(ERROR,
            (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
             errmsg("%s: the message's %s %s %lld bytes, more than outbox.max_message_bytes "
                    "(%d)",
                    function, what, strcmp(what, "headers") == 0 ? "are" : "is",
                    static_cast<long long>(bytes), outbox_max_message_bytes),
             errhint("Kafka refuses records larger than its message.max.bytes; a superuser may "
                     "raise outbox.max_message_bytes if the topic accepts them.")));
    pg_unreachable();
}

// The JSON text Kafka would get for `doc` (the payload as the value, or the
// headers) in UTF-8 may not pass outbox.max_message_bytes.  jsonb prints at
// most 6 bytes per byte it stores (a control character becomes \u00XX), and
// a server encoding's character never needs more than twice its bytes in
// UTF-8: below that bound nothing is rendered.  Its text is never much
// shorter than half what jsonb stores: a document stored in more than twice
// the limit is refused without rendering it (which could pass 1 GB).
void check_json_size(const char *function, const char *what, Jsonb *doc) {
    int64 stored = VARSIZE(doc);
    int64 limit = outbox_max_message_bytes;
    int expand = GetDatabaseEncoding() == PG_UTF8 ? 6 : 12;
    if (stored * expand + 64 <= limit) return;
    if (stored > 2 * limit) too_large(function, what, stored);
    char *text = JsonbToCString(nullptr, &doc->root, VARSIZE(doc));
    int64 len = static_cast<int64>(strlen(text));
    int enc = GetDatabaseEncoding();
    if (enc != PG_UTF8 && enc != PG_SQL_ASCII && len > limit / 2) {
        char *utf8 = pg_server_to_any(text, static_cast<int>(len), PG_UTF8);
        if (utf8 != text) len = static_cast<int64>(strlen(utf8));
    }
    if (len > limit) too_large(function, what, len);
}

// Kafka bounds a record's bytes, not its headers; a record of tens of
// thousands of tiny headers costs every client that reads it, and the relay
// first.  outbox::policy::kMaxHeaders is far above any real use (trace
// context, a schema id, a content type).
void check_header_count(const char *function, Jsonb *headers) {
    int n = static_cast<int>(JB_ROOT_COUNT(headers));
    if (n > outbox::policy::kMaxHeaders)
        ereport(ERROR,
                (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
                 errmsg("%s: the message has %d headers, more than the %d a message may carry",
                        function, n, outbox::policy::kMaxHeaders)));
}

// A key (text or bytes) may not pass outbox.max_message_bytes either (as
// UTF-8, a text key of a single-byte encoding may double).
void check_key_size(const char *function, Datum key, bool is_text) {
    int64 len = static_cast<int64>(toast_raw_datum_size(key)) - VARHDRSZ;
    int enc = GetDatabaseEncoding();
    if (is_text && enc != PG_UTF8 && enc != PG_SQL_ASCII) len *= 2;
    if (len > outbox_max_message_bytes) too_large(function, "key", len);
}

// What write() and write_bytes() take alike: the topic (argument 0),
// headers (3; NULL: none) merged with the session's defaults, and the
// partition (4, when given).
void common_arguments(const char *fn, FunctionCallInfo fcinfo, OutboxNewMessage *m) {
    if (PG_ARGISNULL(0)) outbox_null_argument(fn, "topic");
    outbox_check_topic(fn, PG_GETARG_TEXT_PP(0));
    outbox_check_writable_topic(fn, PG_GETARG_TEXT_PP(0));
    m->topic = PG_GETARG_DATUM(0);
    Datum headers;
    if (PG_ARGISNULL(3)) {
        headers = DirectFunctionCall1(jsonb_in, CStringGetDatum("{}"));
    } else {
        check_headers(fn, PG_GETARG_JSONB_P(3));
        headers = PG_GETARG_DATUM(3);
    }
    check_header_count(fn, DatumGetJsonbP(headers));
    m->headers = merged_headers(headers);
    check_header_count(fn, DatumGetJsonbP(m->headers));
    check_json_size(fn, "headers", DatumGetJsonbP(m->headers));
    check_partition(fn, fcinfo, 4, &m->has_partition, &m->partition);
}

// A version 7 UUID (RFC 9562): 48 bits of Unix milliseconds, then random.
// Time-ordered ids keep inserts into the message_id index at its right edge.
void new_message_id(pg_uuid_t *u) {
    TimestampTz now = GetCurrentTimestamp();
    uint64 unix_ms = static_cast<uint64>(now / 1000) +
                     static_cast<uint64>(POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY *
                         1000;
    for (int i = 0; i < 6; i++) u->data[i] = static_cast<unsigned char>(unix_ms >> (8 * (5 - i)));
    if (!pg_strong_random(u->data + 6, UUID_LEN - 6))
        ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR),
                        errmsg("pg outbox: could not generate random bytes for a message id")));
    u->data[6] = static_cast<unsigned char>((u->data[6] & 0x0f) | 0x70);
    u->data[8] = static_cast<unsigned char>((u->data[8] & 0x3f) | 0x80);
}

// Inserts the message in the caller's transaction and has the commit wake
// the relay, and announce the id to its low-water mark (outbox/low_water.h).
pg_uuid_t *insert(OutboxNewMessage *m) {
    // The insert runs as the extension's owner (SECURITY DEFINER) and names
    // outbox.outbox_message: never into a schema that a role other than a
    // superuser controls (an install whose schema its database owner made).
    if (const char *why = outbox_schema_unsafe(get_namespace_oid("outbox", false)))
        ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                        errmsg("pg outbox: refusing to write: schema \"outbox\" %s", why),
                        errhint("A superuser must own the extension's schema; see the README, "
                                "Security.")));
    // A restored database whose dump did not carry the id sequence would
    // fail every insert on the primary key: check once per backend.
    static Oid healed_database = InvalidOid;
    pg_uuid_t *message_id = static_cast<pg_uuid_t *>(palloc(sizeof(pg_uuid_t)));
    new_message_id(message_id);
    m->message_id = message_id;
    SPI_connect();
    if (healed_database != MyDatabaseId && outbox_heal_id_sequence())
        healed_database = MyDatabaseId;
    int64 id = outbox_insert_message(m);
    outbox_writer_wrote(id);
    SPI_finish();
    outbox_wakeup_note_write();
    return message_id;
}

// The key column of a write_bytes() message: what orders it among its
// key's messages.  The same Kafka key must give the same text as
// outbox.write() would store for it (a tombstone follows the JSON events of
// its key): the key's UTF-8 as server text when it is that; otherwise its
// bytes in hex, which no outbox.write() key of the same bytes can be.
Datum order_key_of_bytes(bytea *key) {
    const char *data = VARDATA_ANY(key);
    std::size_t len = VARSIZE_ANY_EXHDR(key);
    if (char *text = outbox_encoding_from_utf8(data, len))
        return PointerGetDatum(cstring_to_text(text));
    auto *hex = static_cast<char *>(palloc(2 + 2 * len));
    hex[0] = '\\';
    hex[1] = 'x';
    outbox::hex::encode(data, len, hex + 2);
    return PointerGetDatum(cstring_to_text_with_len(hex, static_cast<int>(2 + 2 * len)));
}

}  // namespace

extern "C" {

PGDLLEXPORT Datum outbox_write(PG_FUNCTION_ARGS);
PG_FUNCTION_INFO_V1(outbox_write);

// outbox.write(topic text, key text, payload jsonb, headers jsonb,
//              partition integer) -> uuid.  (Schemas before 1.2 call it
// without the partition.)
Datum outbox_write(PG_FUNCTION_ARGS) {
    const char *fn = "outbox.write";
    OutboxNewMessage m = {};
    common_arguments(fn, fcinfo, &m);
    if (PG_ARGISNULL(1)) outbox_null_argument(fn, "key");
    if (PG_ARGISNULL(2)) outbox_null_argument(fn, "payload");
    check_key_size(fn, PG_GETARG_DATUM(1), true);
    check_json_size(fn, "value", PG_GETARG_JSONB_P(2));
    m.key = PG_GETARG_DATUM(1);
    m.payload = PG_GETARG_DATUM(2);
    PG_RETURN_UUID_P(insert(&m));
}

PGDLLEXPORT Datum outbox_write_bytes(PG_FUNCTION_ARGS);
PG_FUNCTION_INFO_V1(outbox_write_bytes);

// outbox.write_bytes(topic text, key bytea, value bytea, headers jsonb,
//                    partition integer) -> uuid.  A NULL key: a record
// without a key; a NULL value: a tombstone.
Datum outbox_write_bytes(PG_FUNCTION_ARGS) {
    const char *fn = "outbox.write_bytes";
    OutboxNewMessage m = {};
    common_arguments(fn, fcinfo, &m);
    m.is_binary = true;
    m.has_value = !PG_ARGISNULL(2);
    if (m.has_value) {
        bytea *value = PG_GETARG_BYTEA_PP(2);
        int64 len = static_cast<int64>(VARSIZE_ANY_EXHDR(value));
        if (len > outbox_max_message_bytes) too_large(fn, "value", len);
        m.value = PointerGetDatum(value);
    }
    m.has_key_bytes = !PG_ARGISNULL(1);
    if (m.has_key_bytes) {
        check_key_size(fn, PG_GETARG_DATUM(1), false);
        m.key_bytes = PG_GETARG_DATUM(1);
        m.key = order_key_of_bytes(PG_GETARG_BYTEA_PP(1));
    } else if (outbox_schema_version() >= kOutboxSchema16) {
        // No key: the key column is NULL, which equals no key and holds
        // nothing back (a keyless record orders nothing).
        m.keyless = true;
        m.key = (Datum) 0;
    } else {
        m.key = CStringGetTextDatum("");  // schema 1.5 and older: key NOT NULL
    }
    m.payload = DirectFunctionCall1(jsonb_in, CStringGetDatum("null"));
    PG_RETURN_UUID_P(insert(&m));
}

PGDLLEXPORT Datum outbox_confluent_frame(PG_FUNCTION_ARGS);
PG_FUNCTION_INFO_V1(outbox_confluent_frame);

// outbox.confluent_frame(schema_id integer, body bytea) -> bytea: the
// Confluent schema registry's wire format (magic byte 0, the schema id as 4
// big-endian bytes, then the encoded body).
Datum outbox_confluent_frame(PG_FUNCTION_ARGS) {
    const char *fn = "outbox.confluent_frame";
    if (PG_ARGISNULL(0)) outbox_null_argument(fn, "schema_id");
    if (PG_ARGISNULL(1)) outbox_null_argument(fn, "body");
    int32 id = PG_GETARG_INT32(0);
    if (id < 0)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("%s: schema_id must not be negative, got %d", fn, id)));
    bytea *body = PG_GETARG_BYTEA_PP(1);
    Size len = VARSIZE_ANY_EXHDR(body);
    bytea *out = static_cast<bytea *>(palloc(VARHDRSZ + 5 + len));
    SET_VARSIZE(out, VARHDRSZ + 5 + len);
    unsigned char *p = reinterpret_cast<unsigned char *>(VARDATA(out));
    uint32 u = static_cast<uint32>(id);
    p[0] = 0;
    p[1] = static_cast<unsigned char>(u >> 24);
    p[2] = static_cast<unsigned char>(u >> 16);
    p[3] = static_cast<unsigned char>(u >> 8);
    p[4] = static_cast<unsigned char>(u);
    memcpy(p + 5, VARDATA_ANY(body), len);
    PG_RETURN_BYTEA_P(out);
}

PGDLLEXPORT Datum outbox_wake_relay_at_commit(PG_FUNCTION_ARGS);
PG_FUNCTION_INFO_V1(outbox_wake_relay_at_commit);

// outbox._wake_relay_at_commit() -> void: older rows are pending again
// (retry, replay): at commit the relays look from the start and wake.
Datum outbox_wake_relay_at_commit(PG_FUNCTION_ARGS) {
    outbox_wakeup_note_rescan();
    PG_RETURN_VOID();
}

PGDLLEXPORT Datum outbox_wake_inbox_at_commit(PG_FUNCTION_ARGS);
PG_FUNCTION_INFO_V1(outbox_wake_inbox_at_commit);

// outbox._wake_inbox_at_commit() -> void
Datum outbox_wake_inbox_at_commit(PG_FUNCTION_ARGS) {
    outbox_wakeup_note_inbox();
    PG_RETURN_VOID();
}

PGDLLEXPORT Datum outbox_topic_error(PG_FUNCTION_ARGS);
PG_FUNCTION_INFO_V1(outbox_topic_error);

// outbox._topic_error(topic text) -> text: NULL when Kafka accepts it.
Datum outbox_topic_error(PG_FUNCTION_ARGS) {
    text *topic = PG_GETARG_TEXT_PP(0);
    const char *why = outbox::topic_name_error(
        std::string_view(VARDATA_ANY(topic), VARSIZE_ANY_EXHDR(topic)));
    if (!why) PG_RETURN_NULL();
    PG_RETURN_TEXT_P(cstring_to_text(why));
}

PGDLLEXPORT Datum outbox_warn_unless_served(PG_FUNCTION_ARGS);
PG_FUNCTION_INFO_V1(outbox_warn_unless_served);

// outbox._warn_unless_served() -> void: run by CREATE EXTENSION (and so by
// a restore): says once why messages written here would wait.
Datum outbox_warn_unless_served(PG_FUNCTION_ARGS) {
    if (!outbox_preloaded)
        ereport(WARNING,
                (errmsg("pg outbox: no relay runs for this server: shared_preload_libraries does "
                        "not load outbox"),
                 errdetail("Messages written here are kept in outbox.outbox_message and wait "
                           "until a server with the relay runs.")));
    else if (!outbox_serves_this_database())
        ereport(WARNING,
                (errmsg("pg outbox: database \"%s\" is not in outbox.database (\"%s\")",
                        get_database_name(MyDatabaseId), outbox_database),
                 errdetail("Messages written here are kept in outbox.outbox_message and wait "
                           "until the database is listed there."),
                 errhint("Add it to outbox.database in postgresql.conf and restart the server.")));
    PG_RETURN_VOID();
}

}  // extern "C"
