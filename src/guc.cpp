#include <climits>

#include "outbox/guc.h"

#include "outbox/kafka/config.h"
#include "outbox/topic.h"
#include "outbox/workers.h"

extern "C" {
#include "utils/guc.h"
}

extern "C" {
char *outbox_database = nullptr;
char *outbox_brokers = nullptr;
char *outbox_kafka_config = nullptr;
int outbox_batch_size = 1000;
int outbox_poll_interval_ms = 1000;
int outbox_batch_timeout_ms = 5000;
int outbox_workers = 1;
int outbox_max_attempts = 10;
bool outbox_synchronous_commit = true;
int outbox_retention_s = 7 * 24 * 3600;
bool outbox_inbox = false;
char *outbox_inbox_topics = nullptr;
char *outbox_inbox_group = nullptr;
}

namespace {

// Refuses a kafka_config that does not parse, that librdkafka rejects, or
// that would weaken the delivery guarantees; the error names the property.
bool check_kafka_config(char **newval, void **, GucSource) {
    char err[512];
    if (outbox::kafka::check_properties(*newval ? *newval : "", err, sizeof err)) return true;
    GUC_check_errdetail("%s", err);
    return false;
}

// outbox.database: 1..16 distinct names, comma-separated.
bool check_database(char **newval, void **, GucSource) {
    char names[kOutboxMaxDatabases][NAMEDATALEN];
    int n;
    const char *why = nullptr;
    if (outbox_parse_database_list(*newval ? *newval : "", names, &n, &why)) return true;
    GUC_check_errdetail("%s.", why);
    return false;
}

// outbox.inbox_topics: topic names Kafka accepts, comma-separated.
bool check_inbox_topics(char **newval, void **, GucSource) {
    const char *p = *newval ? *newval : "";
    static char why[300];
    for (;;) {
        while (*p == ' ' || *p == '\t') p++;
        const char *start = p;
        while (*p && *p != ',') p++;
        const char *end = p;
        while (end > start && (end[-1] == ' ' || end[-1] == '\t')) end--;
        if (end > start || *p == ',') {
            std::string_view topic(start, static_cast<std::size_t>(end - start));
            if (const char *reason = outbox::topic_name_error(topic)) {
                snprintf(why, sizeof why, "\"%.*s\": %s.", static_cast<int>(topic.size()),
                         topic.data(), reason);
                GUC_check_errdetail("%s", why);
                return false;
            }
        }
        if (*p == '\0') return true;
        p++;
    }
}

}  // namespace

void outbox_define_gucs(void) {
    DefineCustomStringVariable(
        "outbox.database", "Databases the workers serve, comma-separated.",
        "Where CREATE EXTENSION outbox was run; each gets its own relay and maintenance "
        "workers. Changing it needs a restart.",
        &outbox_database, "postgres", PGC_POSTMASTER, 0, check_database, nullptr, nullptr);

    DefineCustomStringVariable(
        "outbox.brokers", "Kafka bootstrap servers (host:port, comma-separated).",
        "Empty: the relay publishes nothing and says so in the log.", &outbox_brokers, "",
        PGC_SIGHUP, 0, nullptr, nullptr, nullptr);

    DefineCustomStringVariable(
        "outbox.kafka_config", "Extra librdkafka properties, as name=value;name=value.",
        "Applied after the relay's own defaults. May hold secrets: superuser-only.",
        &outbox_kafka_config, "", PGC_SIGHUP, GUC_SUPERUSER_ONLY, check_kafka_config, nullptr,
        nullptr);

    DefineCustomIntVariable("outbox.batch_size", "Most messages a relay worker claims at once.",
                            nullptr, &outbox_batch_size, 1000, 1, 100000, PGC_SIGHUP, 0,
                            nullptr, nullptr, nullptr);

    DefineCustomIntVariable(
        "outbox.poll_interval", "Fallback poll of the outbox table when no commit wakes the relay.",
        "Commits that write to the outbox wake the relay at once; this only bounds the delay "
        "for messages inserted in ways that do not (COMMIT PREPARED, direct INSERT).",
        &outbox_poll_interval_ms, 1000, 10, 3600 * 1000, PGC_SIGHUP, GUC_UNIT_MS, nullptr,
        nullptr, nullptr);

    DefineCustomIntVariable(
        "outbox.batch_timeout",
        "Longest a relay transaction waits for Kafka's acknowledgements.",
        "After it, the acknowledged rows are committed and the rest are finished in later, "
        "short transactions, so a slow or unreachable Kafka never holds a transaction open.",
        &outbox_batch_timeout_ms, 5000, 10, 600 * 1000, PGC_SIGHUP, GUC_UNIT_MS, nullptr, nullptr,
        nullptr);

    DefineCustomIntVariable("outbox.workers", "Relay workers per database.",
                            "Each owns a share of the message keys. Needs a restart.",
                            &outbox_workers, 1, 1, 32, PGC_POSTMASTER, 0, nullptr, nullptr,
                            nullptr);

    DefineCustomIntVariable(
        "outbox.max_attempts", "Refusals by Kafka before a message is parked.",
        "Counts only refusals that do not pass by themselves (record too large, unknown topic, "
        "not authorised); an outage never parks a message.",
        &outbox_max_attempts, 10, 1, 1000, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);

    DefineCustomBoolVariable(
        "outbox.synchronous_commit",
        "Whether the relay's own transactions wait for their WAL to be flushed.",
        "They only mark messages published. Off: the relay adds no flush to a busy server, and a "
        "server crash may re-send what it marked in the last moments before (duplicates, never "
        "losses).",
        &outbox_synchronous_commit, true, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);

    DefineCustomIntVariable(
        "outbox.retention",
        "Published messages, expired processed events and processed inbox rows older than "
        "this are deleted.",
        "0 keeps everything. Pending and parked messages are never deleted.",
        &outbox_retention_s, 7 * 24 * 3600, 0, INT_MAX, PGC_SIGHUP, GUC_UNIT_S, nullptr, nullptr,
        nullptr);

    DefineCustomBoolVariable(
        "outbox.inbox", "Starts the inbox workers (a Kafka consumer and a handler) per database.",
        "Needs a restart.", &outbox_inbox, false, PGC_POSTMASTER, 0, nullptr, nullptr, nullptr);

    DefineCustomStringVariable(
        "outbox.inbox_topics", "Kafka topics the inbox consumer stores, comma-separated.",
        "Empty: the consumer stays idle. outbox.inbox must be on.", &outbox_inbox_topics, "",
        PGC_SIGHUP, 0, check_inbox_topics, nullptr, nullptr);

    DefineCustomStringVariable(
        "outbox.inbox_group", "Kafka consumer group of the inbox consumer.",
        "Empty: outbox-<database>.", &outbox_inbox_group, "", PGC_SIGHUP, 0, nullptr, nullptr,
        nullptr);

    MarkGUCPrefixReserved("outbox");
}
