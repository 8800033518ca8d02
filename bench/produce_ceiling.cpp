// The Kafka ceiling for the benchmark: how fast a plain librdkafka producer,
// configured like the relay (idempotent, acks=all, murmur2_random,
// linger.ms=0), gets the same records acknowledged by the same broker.
// No Postgres involved.
//
//   produce_ceiling BOOTSTRAP TOPIC MESSAGES [KEYS] [PAYLOAD_BYTES] [BATCH]
//
// Produces in batches of BATCH records and waits for each batch's delivery
// reports before the next, as the relay does (BATCH=0: one stream, flush at
// the end).  Prints "messages seconds rate".
#include <librdkafka/rdkafka.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

long delivered = 0;
long failed = 0;

void on_delivery(rd_kafka_t *, const rd_kafka_message_t *m, void *) {
    if (m->err)
        ++failed;
    else
        ++delivered;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 4) {
        std::fprintf(stderr, "usage: produce_ceiling BOOTSTRAP TOPIC MESSAGES [KEYS] [PAYLOAD_BYTES] [BATCH]\n");
        return 2;
    }
    const char *bootstrap = argv[1];
    const char *topic = argv[2];
    long n = std::atol(argv[3]);
    long keys = argc > 4 ? std::atol(argv[4]) : 1000;
    long payload_bytes = argc > 5 ? std::atol(argv[5]) : 200;
    long batch = argc > 6 ? std::atol(argv[6]) : 1000;

    char err[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    const char *props[][2] = {{"bootstrap.servers", bootstrap}, {"enable.idempotence", "true"},
                              {"acks", "all"},                  {"partitioner", "murmur2_random"},
                              {"linger.ms", "0"},               {"message.timeout.ms", "0"},
                              {"queue.buffering.max.messages", "1000000"}, {"socket.nagle.disable", getenv("NAGLE_OFF") ? "true" : "false"}};
    for (auto &p : props)
        if (rd_kafka_conf_set(conf, p[0], p[1], err, sizeof err) != RD_KAFKA_CONF_OK) {
            std::fprintf(stderr, "%s\n", err);
            return 1;
        }
    rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    if (!rk) {
        std::fprintf(stderr, "%s\n", err);
        return 1;
    }
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, nullptr);

    // Warm up: connection, metadata, producer id.
    rd_kafka_producev(rk, RD_KAFKA_V_RKT(rkt), RD_KAFKA_V_VALUE(const_cast<char *>("{}"), 2),
                      RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
    rd_kafka_flush(rk, 30000);
    delivered = failed = 0;

    // Payloads shaped like the benchmark's rows: {"id": N, "pad": "xxx..."}.
    std::string pad(static_cast<size_t>(payload_bytes > 20 ? payload_bytes - 20 : 1), 'x');
    auto start = std::chrono::steady_clock::now();
    long sent = 0;
    while (sent < n) {
        long end = batch > 0 ? std::min(n, sent + batch) : n;
        for (; sent < end; ++sent) {
            std::string key = "key-" + std::to_string(sent % keys);
            std::string value = "{\"id\": " + std::to_string(sent) + ", \"pad\": \"" + pad + "\"}";
            // A distinct event_id per record (the inbox benchmark relies on it).
            char event_id[64];
            std::snprintf(event_id, sizeof event_id, "00000000-0000-4000-8000-%012ld",
                          sent % 1000000000000L);
            rd_kafka_headers_t *h = rd_kafka_headers_new(1);
            rd_kafka_header_add(h, "event_id", 8, event_id, 36);
            while (rd_kafka_producev(rk, RD_KAFKA_V_RKT(rkt), RD_KAFKA_V_KEY(key.data(), key.size()),
                                     RD_KAFKA_V_VALUE(value.data(), value.size()),
                                     RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                     RD_KAFKA_V_END) == RD_KAFKA_RESP_ERR__QUEUE_FULL)
                rd_kafka_poll(rk, 10);
        }
        while (delivered + failed < sent) rd_kafka_poll(rk, 1);
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%ld %.3f %.0f\n", delivered, secs, delivered / secs);
    rd_kafka_topic_destroy(rkt);
    rd_kafka_destroy(rk);
    return failed ? 1 : 0;
}
