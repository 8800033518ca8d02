// outbox.inbox_subscribe() and outbox.inbox_unsubscribe(): who may have
// which function handle a topic is decided here, not by who can write
// outbox.inbox_subscription (nobody but the extension's owner can).
//
// A handler runs as the role that owns the function, never more.  So a
// role may subscribe only a function it owns (or whose owner's privileges
// it has, as a member of that role); a superuser may subscribe any.  A
// topic subscribed by one role can be taken over, or unsubscribed, only by
// a role with that role's privileges (or the function owner's), or by a
// superuser.  The subscription records who subscribed (its owner).  Both
// functions run as their caller (not SECURITY DEFINER) and write the table
// as the extension's owner after their checks, as pg_cron's cron.schedule
// does for cron.job.
#include "outbox/pg.h"

#include "outbox/sql_args.h"
#include "outbox/queries/inbox_sql.h"
#include "outbox/queries/spi.h"
#include "outbox/wakeup.h"
#include "outbox/worker_common.h"

extern "C" {
#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "storage/lmgr.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/regproc.h"
#include "utils/syscache.h"
}

namespace sql = outbox::sql::inbox_api;

namespace {

OutboxQuery subscription_of_query = {"reading the topic's subscription", sql::kSubscriptionOf, 1,
                                     {TEXTOID}, SPI_OK_SELECT, nullptr};
OutboxQuery subscribe_query = {"subscribing", sql::kSubscribe, 4,
                               {TEXTOID, REGPROCEDUREOID, REGROLEOID, REGROLEOID}, SPI_OK_INSERT,
                               nullptr};
OutboxQuery subscribe_query_before_16 = {"subscribing", sql::kSubscribeBefore16, 3,
                                         {TEXTOID, REGPROCEDUREOID, REGROLEOID}, SPI_OK_INSERT,
                                         nullptr};
OutboxQuery unsubscribe_query = {"unsubscribing", sql::kUnsubscribe, 1, {TEXTOID}, SPI_OK_DELETE,
                                 nullptr};

bool may_act_for(Oid caller, Oid role) {
    return OidIsValid(role) && (superuser_arg(caller) || has_privs_of_role(caller, role));
}

const char *role_name(Oid role) {
    return OidIsValid(role) ? GetUserNameFromId(role, false) : "(none)";
}

// The role that subscribed a topic, for a message: it may have been dropped
// since (its OID stays in the subscription; only a superuser may then act).
const char *subscriber_desc(Oid role) {
    const char *name = OidIsValid(role) ? GetUserNameFromId(role, true) : nullptr;
    return name ? psprintf("role \"%s\"", name)
                : psprintf("a role that no longer exists (OID %u)", role);
}

// Runs `q` as the extension's owner (the table is not readable or writable
// by others); returns the rows, in SPI_tuptable.
uint64 run_as_extension_owner(OutboxQuery *q, const Datum *values) {
    Oid save_user;
    int save_sec;
    GetUserIdAndSecContext(&save_user, &save_sec);
    SetUserIdAndSecContext(outbox_extension_owner(), save_sec | SECURITY_LOCAL_USERID_CHANGE);
    uint64 n = outbox_run(q, values, nullptr, 0);
    SetUserIdAndSecContext(save_user, save_sec);
    return n;
}

// The current subscription of `topic`: false when there is none.  Takes
// the subscription table's SHARE ROW EXCLUSIVE lock first, till the end of
// the transaction: a subscribe or unsubscribe racing this one waits, so
// what was checked here is what this transaction changes (the handler
// workers' reads are not held up).
bool current_subscription(text *topic, Oid *owner, Oid *handler_owner) {
    LockRelationOid(get_relname_relid("inbox_subscription", get_namespace_oid("outbox", false)),
                    ShareRowExclusiveLock);
    Datum values[1] = {PointerGetDatum(topic)};
    if (run_as_extension_owner(&subscription_of_query, values) == 0) return false;
    bool isnull;
    *owner = DatumGetObjectId(outbox_col(0, 1, &isnull));
    Datum h = outbox_col(0, 2, &isnull);
    *handler_owner = isnull ? InvalidOid : DatumGetObjectId(h);
    return true;
}

}  // namespace

extern "C" {

PGDLLEXPORT Datum outbox_inbox_subscribe(PG_FUNCTION_ARGS);
PG_FUNCTION_INFO_V1(outbox_inbox_subscribe);

// outbox.inbox_subscribe(topic text, handler regprocedure) -> void
Datum outbox_inbox_subscribe(PG_FUNCTION_ARGS) {
    const char *fn = "outbox.inbox_subscribe";
    if (PG_ARGISNULL(0)) outbox_null_argument(fn, "topic");
    if (PG_ARGISNULL(1)) outbox_null_argument(fn, "handler");
    text *topic = PG_GETARG_TEXT_PP(0);
    Oid handler = PG_GETARG_OID(1);
    outbox_check_topic(fn, topic);

    HeapTuple tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(handler));
    if (!HeapTupleIsValid(tup))
        ereport(ERROR, (errcode(ERRCODE_UNDEFINED_FUNCTION),
                        errmsg("%s: function %u does not exist", fn, handler)));
    auto *proc = reinterpret_cast<Form_pg_proc>(GETSTRUCT(tup));
    Oid nsp = get_namespace_oid("outbox", false);
    Oid message_type = GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid, CStringGetDatum("inbox_message"),
                                   ObjectIdGetDatum(nsp));
    Oid array_type = get_array_type(message_type);
    bool shape_ok = proc->pronargs == 1 && proc->prorettype == VOIDOID && !proc->proretset &&
                    proc->prokind == PROKIND_FUNCTION &&
                    (proc->proargtypes.values[0] == message_type ||
                     proc->proargtypes.values[0] == array_type);
    Oid function_owner = proc->proowner;
    ReleaseSysCache(tup);
    char *name = format_procedure(handler);
    if (!shape_ok)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("%s: handler %s must take (outbox.inbox_message) or "
                               "(outbox.inbox_message[]) and return void",
                               fn, name)));

    Oid caller = GetUserId();
    if (!may_act_for(caller, function_owner))
        ereport(ERROR,
                (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                 errmsg("%s: role \"%s\" may not subscribe %s", fn, role_name(caller), name),
                 errdetail("A handler runs as the role that owns it (\"%s\"): only that role, a "
                           "member of it, or a superuser may subscribe it.",
                           role_name(function_owner))));
    if (!outbox::pg::may_execute_function(handler, function_owner))
        ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                        errmsg("%s: role \"%s\" may not execute its own function %s", fn,
                               role_name(function_owner), name)));

    SPI_connect();
    Oid owner, handler_owner;
    if (current_subscription(topic, &owner, &handler_owner) && !may_act_for(caller, owner) &&
        !may_act_for(caller, handler_owner))
        ereport(ERROR,
                (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                 errmsg("%s: topic \"%s\" is subscribed by %s", fn,
                        text_to_cstring(topic), subscriber_desc(owner)),
                 errdetail("Only that role, the owner of its handler, a member of either, or a "
                           "superuser may replace the subscription.")));
    Datum values[4] = {PointerGetDatum(topic), ObjectIdGetDatum(handler), ObjectIdGetDatum(caller),
                       ObjectIdGetDatum(function_owner)};
    run_as_extension_owner(outbox_schema_version() >= kOutboxSchema16 ? &subscribe_query
                                                                      : &subscribe_query_before_16,
                           values);
    SPI_finish();
    outbox_wakeup_note_inbox();
    PG_RETURN_VOID();
}

PGDLLEXPORT Datum outbox_inbox_unsubscribe(PG_FUNCTION_ARGS);
PG_FUNCTION_INFO_V1(outbox_inbox_unsubscribe);

// outbox.inbox_unsubscribe(topic text) -> boolean: true when there was a
// subscription.  Its records stay and wait.
Datum outbox_inbox_unsubscribe(PG_FUNCTION_ARGS) {
    const char *fn = "outbox.inbox_unsubscribe";
    if (PG_ARGISNULL(0)) outbox_null_argument(fn, "topic");
    text *topic = PG_GETARG_TEXT_PP(0);
    Oid caller = GetUserId();
    SPI_connect();
    Oid owner, handler_owner;
    bool found = current_subscription(topic, &owner, &handler_owner);
    if (found && !may_act_for(caller, owner) && !may_act_for(caller, handler_owner))
        ereport(ERROR,
                (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                 errmsg("%s: topic \"%s\" is subscribed by %s", fn,
                        text_to_cstring(topic), subscriber_desc(owner)),
                 errdetail("Only that role, the owner of its handler, a member of either, or a "
                           "superuser may unsubscribe it.")));
    if (found) {
        Datum values[1] = {PointerGetDatum(topic)};
        run_as_extension_owner(&unsubscribe_query, values);
    }
    SPI_finish();
    PG_RETURN_BOOL(found);
}

}  // extern "C"
