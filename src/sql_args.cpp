#include "outbox/common/topic.h"

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
