#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include "outbox/common/list.h"
#include "outbox/common/standby.h"
#include "outbox/json/headers.h"
#include "outbox/kafka/config.h"
#include "outbox/policy.h"

#include "outbox/guc.h"

extern "C" {
#include "utils/guc.h"
}

extern "C" {
char *outbox_database = nullptr;
char *outbox_brokers = nullptr;
char *outbox_kafka_config = nullptr;
char *outbox_kafka_config_file = nullptr;
int outbox_batch_size = 5000;
int outbox_inbox_batch_bytes_kb = 16 * 1024;
int outbox_poll_interval_ms = 1000;
int outbox_batch_timeout_ms = 5000;
int outbox_linger_ms = 10;
int outbox_inbox_handler_timeout_ms = 60 * 1000;
int outbox_workers = 1;
int outbox_max_attempts = 10;
bool outbox_synchronous_commit = true;
// lz4 where the server has it: cheap on the worker's CPU.
#ifdef USE_LZ4
#define OUTBOX_DEFAULT_WAL_COMPRESSION OUTBOX_WAL_COMPRESSION_LZ4
#else
#define OUTBOX_DEFAULT_WAL_COMPRESSION OUTBOX_WAL_COMPRESSION_SERVER
#endif
int outbox_wal_compression = OUTBOX_DEFAULT_WAL_COMPRESSION;
int outbox_retention_s = 7 * 24 * 3600;
int outbox_max_message_bytes = 1024 * 1024;
char *outbox_default_headers = nullptr;
bool outbox_inbox = false;
char *outbox_inbox_topics = nullptr;
char *outbox_inbox_group = nullptr;
int outbox_inbox_workers = 1;
char *outbox_wait_for_standbys = nullptr;
int outbox_standby_lsn = OUTBOX_STANDBY_LSN_FLUSH;
int outbox_delivery = OUTBOX_DELIVERY_AT_LEAST_ONCE;
char *outbox_progress_topic = nullptr;
char *outbox_fault_point = nullptr;
}

bool outbox_preloaded = false;

namespace {

// Only the methods this server was built with, as Postgres' own
// wal_compression lists them: a worker must never set one it lacks.
const struct config_enum_entry kWalCompressionOptions[] = {
    {"server", OUTBOX_WAL_COMPRESSION_SERVER, false},
    {"off", OUTBOX_WAL_COMPRESSION_OFF, false},
    {"pglz", OUTBOX_WAL_COMPRESSION_PGLZ, false},
#ifdef USE_LZ4
    {"lz4", OUTBOX_WAL_COMPRESSION_LZ4, false},
#endif
#ifdef USE_ZSTD
    {"zstd", OUTBOX_WAL_COMPRESSION_ZSTD, false},
#endif
    {nullptr, 0, false},
};

const struct config_enum_entry kStandbyLsnOptions[] = {
    {"write", OUTBOX_STANDBY_LSN_WRITE, false},
    {"flush", OUTBOX_STANDBY_LSN_FLUSH, false},
    {"replay", OUTBOX_STANDBY_LSN_REPLAY, false},
    {nullptr, 0, false},
};

const struct config_enum_entry kDeliveryOptions[] = {
    {"at_least_once", OUTBOX_DELIVERY_AT_LEAST_ONCE, false},
    {"exactly_once", OUTBOX_DELIVERY_EXACTLY_ONCE, false},
    {nullptr, 0, false},
};

// The check hooks call pure C++ that reports by value; its text is copied
// into a static buffer before anything Postgres runs (GUC_check_errdetail
// formats it).
char why[1024];

bool take(bool ok, const std::string &text) noexcept {
    if (!ok) strlcpy(why, text.c_str(), sizeof why);
    return ok;
}

bool list_ok(const char *value, bool topics) noexcept {
    try {
        std::vector<std::string> items;
        std::string error;
        bool ok = topics ? outbox::parse_topic_list(value, items, error)
                         : outbox::parse_name_list(value, 16, NAMEDATALEN - 1, items, error);
        return take(ok, error);
    } catch (...) {
        return take(false, "out of memory");
    }
}

// outbox.kafka_config: refused when it does not parse, when librdkafka
// refuses a property, when it would weaken the delivery guarantees, or when
// it holds a secret.  The message names the property and never repeats the
// value (Postgres' own "invalid value for parameter" would print all of it).
bool check_kafka_config(char **newval, void **, GucSource) {
    if (outbox::kafka::check_properties(*newval ? *newval : "", why, sizeof why)) return true;
    GUC_check_errmsg("invalid value for parameter \"outbox.kafka_config\"");
    GUC_check_errdetail("%s.", why);
    return false;
}

bool standbys_ok(const char *value) noexcept {
    try {
        outbox::standby::Required required;
        std::string error;
        return take(outbox::standby::parse(value, required, error), error);
    } catch (...) {
        return take(false, "out of memory");
    }
}

bool check_wait_for_standbys(char **newval, void **, GucSource) {
    if (standbys_ok(*newval ? *newval : "")) return true;
    GUC_check_errdetail("outbox.wait_for_standbys: %s.", why);
    return false;
}

bool check_database(char **newval, void **, GucSource) {
    if (list_ok(*newval ? *newval : "", false)) return true;
    GUC_check_errdetail("outbox.database: %s.", why);
    return false;
}

bool check_progress_topic(char **newval, void **, GucSource) {
    why[0] = '\0';
    if (list_ok(*newval ? *newval : "", true) && (*newval)[0] != '\0' && !strchr(*newval, ','))
        return true;
    GUC_check_errdetail("outbox.progress_topic must name one Kafka topic%s%s.",
                        why[0] ? ": " : "", why);
    return false;
}

bool check_inbox_topics(char **newval, void **, GucSource) {
    if (list_ok(*newval ? *newval : "", true)) return true;
    GUC_check_errdetail("%s.", why);
    return false;
}

// outbox.default_headers: empty, or a JSON object of strings that jsonb
// takes (no \u0000) and that leaves each message its own event_id.
bool default_headers_ok(const char *value) noexcept {
    try {
        std::vector<outbox::json::Header> headers;
        std::string error;
        if (!outbox::json::decode_headers(value, headers, error)) return take(false, error);
        if (headers.size() > static_cast<std::size_t>(outbox::policy::kMaxHeaders))
            return take(false, "more than " + std::to_string(outbox::policy::kMaxHeaders) +
                                   " headers");
        for (const auto &h : headers) {
            if (h.name == "event_id")
                return take(false, "it may not set \"event_id\": each message's event_id is "
                                   "its own message_id, or a header of the message itself");
            if (h.name.find('\0') != std::string::npos || h.value.find('\0') != std::string::npos)
                return take(false, "header \"" + h.name.substr(0, h.name.find('\0')) +
                                       "\" holds \\u0000, which Postgres' jsonb refuses");
        }
        return true;
    } catch (...) {
        return take(false, "out of memory");
    }
}

bool check_default_headers(char **newval, void **, GucSource) {
    const char *v = *newval ? *newval : "";
    if (v[0] == '\0' || default_headers_ok(v)) return true;
    GUC_check_errdetail("outbox.default_headers must be a JSON object of strings: %s.", why);
    return false;
}

}  // namespace

bool outbox_is_progress_topic(const char *topic, std::size_t len) noexcept {
    const char *progress = outbox_progress_topic;
    return progress && progress[0] && strlen(progress) == len && memcmp(progress, topic, len) == 0;
}

void outbox_define_gucs(void) {
    DefineCustomStringVariable(
        "outbox.database", "Databases the workers serve, comma-separated.",
        "Where CREATE EXTENSION outbox was run; each gets its own workers. Changing it needs a "
        "restart.",
        &outbox_database, "postgres", PGC_POSTMASTER, 0, check_database, nullptr, nullptr);

    DefineCustomStringVariable(
        "outbox.brokers", "Kafka bootstrap servers (host:port, comma-separated).",
        "Empty: nothing is published or consumed, and the log says so.", &outbox_brokers, "",
        PGC_SIGHUP, 0, nullptr, nullptr, nullptr);

    DefineCustomStringVariable(
        "outbox.kafka_config", "Extra librdkafka properties, as name=value;name=value.",
        "Applied after the workers' own defaults. No secrets: members of pg_read_all_settings "
        "can read it; passwords and keys go in outbox.kafka_config_file.",
        &outbox_kafka_config, "", PGC_SIGHUP, GUC_SUPERUSER_ONLY, check_kafka_config, nullptr,
        nullptr);

    DefineCustomStringVariable(
        "outbox.kafka_config_file",
        "File of secret librdkafka properties (passwords, keys), one name=value per line.",
        "Read by the workers only; it must belong to the server's user and be readable by it "
        "alone, like ssl_key_file.",
        &outbox_kafka_config_file, "", PGC_SIGHUP, GUC_SUPERUSER_ONLY, nullptr, nullptr,
        nullptr);

    DefineCustomIntVariable(
        "outbox.batch_size",
        "Most messages a relay claims, or records the inbox consumer stores, at once.", nullptr,
        &outbox_batch_size, 5000, 1, 100000, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);

    DefineCustomIntVariable(
        "outbox.inbox_batch_bytes", "Most bytes of records the inbox consumer stores at once.",
        "Keys, values and headers of a batch; the record that crosses it is the batch's last "
        "(the first always comes), so a batch holds at most this and one record more.",
        &outbox_inbox_batch_bytes_kb, 16 * 1024, 64, 1024 * 1024, PGC_SIGHUP, GUC_UNIT_KB, nullptr,
        nullptr, nullptr);

    DefineCustomIntVariable(
        "outbox.poll_interval", "Fallback poll when no commit wakes a worker.",
        "Commits that write to the outbox or the inbox wake the workers at once; this only "
        "bounds the delay for rows that arrive otherwise (COMMIT PREPARED, a direct INSERT).",
        &outbox_poll_interval_ms, 1000, 10, 3600 * 1000, PGC_SIGHUP, GUC_UNIT_MS, nullptr,
        nullptr, nullptr);

    DefineCustomIntVariable(
        "outbox.batch_timeout",
        "Longest a relay transaction waits for Kafka's acknowledgements.",
        "After it, the acknowledged rows are committed and the rest are finished in later, "
        "short transactions, so a slow or unreachable Kafka never holds a transaction open.",
        &outbox_batch_timeout_ms, 5000, 10, 600 * 1000, PGC_SIGHUP, GUC_UNIT_MS, nullptr, nullptr,
        nullptr);

    DefineCustomIntVariable(
        "outbox.inbox_handler_timeout", "Longest one inbox handler call may run.",
        "A call that runs longer is cancelled like a statement past statement_timeout: it "
        "counts as a failed attempt, so a handler that never returns is retried and parked, "
        "and the other topics go on. 0: no limit.",
        &outbox_inbox_handler_timeout_ms, 60 * 1000, 0, INT_MAX, PGC_SIGHUP, GUC_UNIT_MS, nullptr,
        nullptr, nullptr);

    DefineCustomIntVariable(
        "outbox.linger", "Longest a busy relay lets commits gather before it claims them.",
        "Under load the relay waits 1 ms for every 500 messages per second arriving, up to "
        "this, so that a batch carries more than a message or two; a quiet server publishes "
        "each commit at once. 0: never wait.",
        &outbox_linger_ms, 10, 0, 1000, PGC_SIGHUP, GUC_UNIT_MS, nullptr, nullptr, nullptr);

    DefineCustomIntVariable("outbox.workers", "Relay workers per database.",
                            "Each owns a share of the message keys. Needs a restart.",
                            &outbox_workers, 1, 1, 32, PGC_POSTMASTER, 0, nullptr, nullptr,
                            nullptr);

    DefineCustomIntVariable(
        "outbox.max_attempts",
        "Refusals by Kafka (relay) or failed handler calls (inbox) before a message is parked.",
        "For the relay only refusals that do not pass by themselves count (record too large, "
        "unknown topic, not authorised); an outage never parks a message.",
        &outbox_max_attempts, 10, 1, 1000, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);

    DefineCustomBoolVariable(
        "outbox.synchronous_commit",
        "Whether the relay's own transactions wait for their WAL to be flushed.",
        "They only mark messages published. Off: the relay adds no flush to a busy server, and a "
        "server crash may re-send what it marked in the last moments before (duplicates, never "
        "losses).",
        &outbox_synchronous_commit, true, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);

    DefineCustomEnumVariable(
        "outbox.wal_compression",
        "How the workers' own writes compress full-page images in the WAL: server follows "
        "wal_compression.",
        "A mark is the first change to a page since the last checkpoint once per page of a "
        "backlog older than that checkpoint, and writes the whole page into the WAL; compressing "
        "those images keeps a large backlog's drain near the speed of a small one.",
        &outbox_wal_compression, OUTBOX_DEFAULT_WAL_COMPRESSION, kWalCompressionOptions,
        PGC_SIGHUP, 0, nullptr, nullptr, nullptr);

    DefineCustomIntVariable(
        "outbox.retention",
        "Published messages, expired processed events and processed inbox rows older than "
        "this are deleted.",
        "0 keeps everything. Pending and parked messages are never deleted.",
        &outbox_retention_s, 7 * 24 * 3600, 0, INT_MAX, PGC_SIGHUP, GUC_UNIT_S, nullptr, nullptr,
        nullptr);

    DefineCustomIntVariable(
        "outbox.max_message_bytes", "Largest Kafka value outbox.write() and write_bytes() accept.",
        "A larger message is refused at write time (SQLSTATE 54000). Superusers may change it.",
        &outbox_max_message_bytes, 1024 * 1024, 1, 1000000000, PGC_SUSET, GUC_UNIT_BYTE, nullptr,
        nullptr, nullptr);

    DefineCustomStringVariable(
        "outbox.default_headers",
        "Kafka headers added to every message this session writes (trace context).",
        "A JSON object of strings; a message's own headers win. Usually SET LOCAL by middleware.",
        &outbox_default_headers, "", PGC_USERSET, 0, check_default_headers, nullptr, nullptr);

    DefineCustomBoolVariable(
        "outbox.inbox", "Starts the inbox workers (a Kafka consumer and handlers) per database.",
        "Needs a restart.", &outbox_inbox, false, PGC_POSTMASTER, 0, nullptr, nullptr, nullptr);

    DefineCustomStringVariable(
        "outbox.inbox_topics", "Kafka topics the inbox consumer stores, comma-separated.",
        "Empty: the consumer stays idle. outbox.inbox must be on.", &outbox_inbox_topics, "",
        PGC_SIGHUP, 0, check_inbox_topics, nullptr, nullptr);

    DefineCustomStringVariable(
        "outbox.inbox_group", "Prefix of the inbox consumers' Kafka group ids.",
        "Each database's consumer is group <prefix>-<database>; empty: outbox-<database>.",
        &outbox_inbox_group, "", PGC_SIGHUP, 0, nullptr, nullptr, nullptr);

    DefineCustomIntVariable("outbox.inbox_workers", "Inbox handler workers per database.",
                            "Each owns a share of the record keys. Needs a restart.",
                            &outbox_inbox_workers, 1, 1, 32, PGC_POSTMASTER, 0, nullptr, nullptr,
                            nullptr);

    DefineCustomStringVariable(
        "outbox.wait_for_standbys",
        "Streaming standbys that must hold a batch's WAL before the relay produces it.",
        "Empty: none. *: any one standby. synchronous_standby_names: the standbys that setting "
        "makes synchronous, by its rule. Otherwise a comma-separated list of application_name "
        "values, every one of which must hold it. A failover to such a standby then never "
        "leaves Kafka with a message the promoted server lacks; while it is missing or behind, "
        "publishing waits.",
        &outbox_wait_for_standbys, "", PGC_SIGHUP, 0, check_wait_for_standbys, nullptr, nullptr);

    DefineCustomEnumVariable(
        "outbox.standby_lsn",
        "Which of a standby's positions outbox.wait_for_standbys compares: write, flush or "
        "replay.",
        "flush: the WAL is on the standby's disk and survives its crash and promotion. replay: "
        "also visible to queries there.",
        &outbox_standby_lsn, OUTBOX_STANDBY_LSN_FLUSH, kStandbyLsnOptions, PGC_SIGHUP, 0, nullptr,
        nullptr, nullptr);

    DefineCustomEnumVariable(
        "outbox.delivery", "How the relay delivers: at_least_once or exactly_once.",
        "exactly_once: one Kafka transaction per batch, with the batch's progress in "
        "outbox.progress_topic in the same transaction; consumers reading read_committed see "
        "each message once, and a relay with this database's identity elsewhere is fenced. "
        "Applied between batches.",
        &outbox_delivery, OUTBOX_DELIVERY_AT_LEAST_ONCE, kDeliveryOptions, PGC_SIGHUP, 0,
        nullptr, nullptr, nullptr);

    DefineCustomStringVariable(
        "outbox.progress_topic",
        "The compacted Kafka topic where exactly-once relays record each transaction's rows.",
        "Create it before setting outbox.delivery = exactly_once (cleanup.policy=compact).",
        &outbox_progress_topic, "pg_outbox_progress", PGC_SIGHUP, 0, check_progress_topic,
        nullptr, nullptr);

    // Tests only: the relay kills itself (SIGKILL) at this step of an
    // exactly-once batch, as kill -9 would.  Not shown, superuser only.
    DefineCustomStringVariable("outbox.fault_point", "Test only: a step of a batch to die at.",
                               nullptr, &outbox_fault_point, "", PGC_SUSET,
                               GUC_NO_SHOW_ALL | GUC_NOT_IN_SAMPLE, nullptr, nullptr, nullptr);

    MarkGUCPrefixReserved("outbox");
}

const char *outbox_wal_compression_value(void) {
    for (const config_enum_entry *e = kWalCompressionOptions; e->name; e++)
        if (e->val == outbox_wal_compression && e->val != OUTBOX_WAL_COMPRESSION_SERVER)
            return e->name;
    return nullptr;
}
