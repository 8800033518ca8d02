// A worker's link to Kafka: see outbox/kafka_link.h.
#include "outbox/kafka_link.h"

#include <cstring>

#include "outbox/worker_common.h"
#include "outbox/workers.h"

extern "C" {
#include "lib/stringinfo.h"
}

char *outbox_link_settings(const char *const *parts, int n) {
    StringInfoData s;
    initStringInfo(&s);
    for (int i = 0; i < n; i++) {
        const char *p = parts[i] ? parts[i] : "";
        appendStringInfo(&s, "%zu:%s;", strlen(p), p);
    }
    return s.data;
}

bool outbox_link_matches(const OutboxKafkaLink *link, const char *settings,
                         const std::vector<outbox::kafka::Property> &client_secrets) {
    return link->built != nullptr && strcmp(link->built, settings) == 0 &&
           outbox::kafka::same_properties(link->secrets, client_secrets);
}

void outbox_link_connected(OutboxKafkaLink *link, const char *settings) {
    link->built = outbox_keep_string(link->built, settings);
    link->connect_error.forget();
}

void outbox_link_connect_failed(OutboxWorker *w, OutboxKafkaLink *link, const char *client,
                                const char *err) {
    if (link->connect_error.first_time(err))
        ereport(WARNING, (errmsg("%s: cannot create the Kafka %s: %s", w->label, client, err)));
    outbox_stats_error(err);
}

void outbox_link_reload(OutboxWorker *w, OutboxKafkaLink *link, const char *stops) {
    link->secrets_ok = outbox_worker_load_secrets(w, link->secrets, link->secrets_ok,
                                                  link->connect_error, stops);
}

void outbox_link_show_state(OutboxKafkaLink *link, outbox::kafka::BrokerState state) {
    int s = state == outbox::kafka::BrokerState::Up     ? OUTBOX_BROKER_UP
            : state == outbox::kafka::BrokerState::Down ? OUTBOX_BROKER_DOWN
                                                        : OUTBOX_BROKER_UNKNOWN;
    if (s == link->shown_state) return;
    outbox_stats_set_broker_state(static_cast<OutboxBrokerState>(s));
    link->shown_state = s;
}
