#include "outbox/common/topic.h"

#include "outbox/guc.h"
#include "outbox/sql_args.h"

extern "C" {
#include "utils/builtins.h"
}

void outbox_null_argument(const char *function, const char *name) {
    ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                    errmsg("%s: %s must not be NULL", function, name)));
    pg_unreachable();
}

void outbox_check_topic(const char *function, text *topic) {
    std::size_t len = VARSIZE_ANY_EXHDR(topic);
    const char *why = outbox::topic_name_error(std::string_view(VARDATA_ANY(topic), len));
    if (why)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("%s: invalid topic \"%s\"", function, text_to_cstring(topic)),
                        errdetail("%s.", why)));
}

void outbox_check_writable_topic(const char *function, text *topic) {
    // Kafka's own topics (__consumer_offsets, __transaction_state, and any
    // name it keeps for itself: "__" first): a message there could break
    // every consumer group or transaction of the cluster, and Kafka refuses
    // most producers there anyway.
    if (VARSIZE_ANY_EXHDR(topic) >= 2 && VARDATA_ANY(topic)[0] == '_' && VARDATA_ANY(topic)[1] == '_')
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("%s: topic \"%s\" is one of Kafka's internal topics", function,
                               text_to_cstring(topic)),
                        errdetail("Topics whose names begin with \"__\" belong to Kafka itself "
                                  "(__consumer_offsets, __transaction_state)."),
                        errhint("Write to a topic of your own.")));
    if (outbox_is_progress_topic(VARDATA_ANY(topic), VARSIZE_ANY_EXHDR(topic)))
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("%s: topic \"%s\" is outbox.progress_topic", function,
                               outbox_progress_topic),
                        errdetail("Exactly-once relays record their progress there; a message "
                                  "on it could stop them."),
                        errhint("Write to another topic, or set outbox.progress_topic to a "
                                "topic that no message uses.")));
}
