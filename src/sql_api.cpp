// SQL-callable functions written in C++.  (mark_processed and is_processed
// are plain SQL/plpgsql in outbox--1.0.sql.)
#include "outbox/pg.h"

#include "outbox/outbox_queries.h"
#include "outbox/topic.h"
#include "outbox/wakeup.h"

extern "C" {
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"
}

namespace {

[[noreturn]] void null_argument(const char *name) {
    ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                    errmsg("outbox.write: %s must not be NULL", name)));
    pg_unreachable();
}

void check_topic(text *topic) {
    std::size_t len = VARSIZE_ANY_EXHDR(topic);
    const char *why = outbox::topic_name_error(std::string_view(VARDATA_ANY(topic), len));
    if (why)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("outbox.write: invalid topic \"%s\"", text_to_cstring(topic)),
                        errdetail("%s.", why)));
}

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
void check_headers(Jsonb *headers) {
    if (!JB_ROOT_IS_OBJECT(headers)) {
        const char *what = "an array";
        JsonbValue scalar;
        if (JB_ROOT_IS_SCALAR(headers) && JsonbExtractScalar(&headers->root, &scalar))
            what = jsonb_value_word(scalar);
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("outbox.write: headers must be a JSON object of strings"),
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
                            errmsg("outbox.write: headers must be a JSON object of strings"),
                            errdetail("Header \"%s\" is %s.", name ? name : "?",
                                      jsonb_value_word(v))));
        }
    }
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
                        errmsg("outbox.write: could not generate random bytes for a message id")));
    u->data[6] = static_cast<unsigned char>((u->data[6] & 0x0f) | 0x70);
    u->data[8] = static_cast<unsigned char>((u->data[8] & 0x3f) | 0x80);
}

}  // namespace

extern "C" {

PGDLLEXPORT Datum outbox_write(PG_FUNCTION_ARGS);
PG_FUNCTION_INFO_V1(outbox_write);

// outbox.write(topic text, key text, payload jsonb, headers jsonb) -> uuid
Datum outbox_write(PG_FUNCTION_ARGS) {
    if (PG_ARGISNULL(0)) null_argument("topic");
    if (PG_ARGISNULL(1)) null_argument("key");
    if (PG_ARGISNULL(2)) null_argument("payload");

    check_topic(PG_GETARG_TEXT_PP(0));
    Datum headers;
    if (PG_ARGISNULL(3)) {
        headers = DirectFunctionCall1(jsonb_in, CStringGetDatum("{}"));
    } else {
        check_headers(PG_GETARG_JSONB_P(3));
        headers = PG_GETARG_DATUM(3);
    }

    pg_uuid_t *message_id = static_cast<pg_uuid_t *>(palloc(sizeof(pg_uuid_t)));
    new_message_id(message_id);

    SPI_connect();
    outbox_insert_message(message_id, PG_GETARG_DATUM(0), PG_GETARG_DATUM(1), PG_GETARG_DATUM(2),
                          headers);
    SPI_finish();

    outbox_wakeup_note_write();
    PG_RETURN_UUID_P(message_id);
}

PGDLLEXPORT Datum outbox_wake_relay_at_commit(PG_FUNCTION_ARGS);
PG_FUNCTION_INFO_V1(outbox_wake_relay_at_commit);

// outbox._wake_relay_at_commit() -> void
Datum outbox_wake_relay_at_commit(PG_FUNCTION_ARGS) {
    outbox_wakeup_note_write();
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

}  // extern "C"
