// A worker's link to Kafka: what its client (the relay's producer, the inbox
// consumer) was built from, and the steps both take around it: whether the
// client still matches the settings, reading the secrets file on reload,
// saying a failed connect once, showing the broker's state in the stats.
// Postgres side (ereport, palloc): call it from a worker's turn, never from
// the C++ side.
#pragma once

#include <vector>

#include "outbox/common/said_once.h"
#include "outbox/kafka/client.h"
#include "outbox/kafka/config.h"
#include "outbox/shmem.h"

struct OutboxWorker;

struct OutboxKafkaLink {
    // The settings the client was built from, as one string (see
    // outbox_link_settings); NULL while there is no client.
    char *built = nullptr;
    // outbox.kafka_config_file as last read, and whether it can be used.
    std::vector<outbox::kafka::Property> secrets;
    bool secrets_ok = true;
    outbox::SaidOnce connect_error;
    int shown_state = -1;  // the broker state last put in the stats
};

// The settings a client is built from, each part kept whole (length and
// text), so that no two different lists give the same string.  Palloc'd.
char *outbox_link_settings(const char *const *parts, int n);

// Whether a client built from `built` with `client_secrets` still matches
// `settings` and the secrets file as last read.
bool outbox_link_matches(const OutboxKafkaLink *link, const char *settings,
                         const std::vector<outbox::kafka::Property> &client_secrets);

// A client was built from `settings`: remember them, and that connecting
// works again.
void outbox_link_connected(OutboxKafkaLink *link, const char *settings);

// Connecting failed with `err` (librdkafka's or our own text, no secret):
// one WARNING per distinct error, and the error in the worker's stats.
void outbox_link_connect_failed(OutboxWorker *w, OutboxKafkaLink *link, const char *client,
                                const char *err);

// On reload: reads outbox.kafka_config_file again; `stops` says what waits
// while it cannot be used ("published", "consumed").
void outbox_link_reload(OutboxWorker *w, OutboxKafkaLink *link, const char *stops);

// The client's view of the brokers into the worker's stats slot, when it
// changed.
void outbox_link_show_state(OutboxKafkaLink *link, outbox::kafka::BrokerState state);
