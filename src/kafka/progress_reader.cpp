#include "outbox/pure_tu.h"
#include "outbox/kafka/progress_reader.h"

#include <librdkafka/rdkafka.h>

#include <chrono>
#include <memory>
#include <vector>

namespace outbox::kafka {

namespace {

struct Errors {
    std::string last;
};

void on_error(rd_kafka_t *, int err, const char *reason, void *opaque) {
    try {
        if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN || err == RD_KAFKA_RESP_ERR__FATAL ||
            err == RD_KAFKA_RESP_ERR__AUTHENTICATION || err == RD_KAFKA_RESP_ERR__SSL)
            static_cast<Errors *>(opaque)->last = reason ? reason : "";
    } catch (...) {
    }
}

void on_log(const rd_kafka_t *, int, const char *, const char *) {}

struct Destroy {
    void operator()(rd_kafka_t *rk) const noexcept {
        rd_kafka_consumer_close(rk);
        rd_kafka_destroy(rk);
    }
};

}  // namespace

bool read_progress(const ClientSettings &client, const std::string &topic,
                   const std::string &prefix, int timeout_ms,
                   std::map<std::string, std::map<int32_t, std::string>> &last,
                   std::string &error) noexcept {
    try {
        last.clear();
        Errors errors;
        const std::vector<Property> own = {
            {"group.id", "pg_outbox-progress-reader"},
            {"enable.auto.commit", "false"},
            {"enable.auto.offset.store", "false"},
            {"auto.offset.reset", "earliest"},
            {"enable.partition.eof", "true"},
        };
        ConfPtr conf = new_client_conf(Role::Consumer, client, own,
                                       {&errors, &on_error, &on_log}, error);
        if (!conf) return false;
        // What recovery depends on, whatever outbox.kafka_config says.
        for (const Property &p : std::vector<Property>{{"isolation.level", "read_committed"},
                                                       {"enable.partition.eof", "true"},
                                                       {"enable.auto.commit", "false"}})
            if (!set_property(conf.get(), p.name.c_str(), p.value, error)) return false;
        char errstr[512];
        rd_kafka_t *raw = rd_kafka_new(RD_KAFKA_CONSUMER, conf.get(), errstr, sizeof errstr);
        if (!raw) {
            error = errstr;
            return false;
        }
        conf.release();
        std::unique_ptr<rd_kafka_t, Destroy> rk(raw);
        rd_kafka_poll_set_consumer(rk.get());

        auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
        auto left = [&] {
            return static_cast<int>(std::max<long long>(
                0, std::chrono::duration_cast<std::chrono::milliseconds>(
                       deadline - std::chrono::steady_clock::now())
                       .count()));
        };

        rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk.get(), topic.c_str(), nullptr);
        const rd_kafka_metadata_t *md = nullptr;
        rd_kafka_resp_err_t err = rd_kafka_metadata(rk.get(), 0, rkt, &md, left());
        rd_kafka_topic_destroy(rkt);
        if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
            error = "cannot read the metadata of outbox.progress_topic \"" + topic +
                    "\": " + rd_kafka_err2str(err) +
                    (errors.last.empty() ? "" : " (" + errors.last + ")");
            return false;
        }
        int partitions = 0;
        rd_kafka_resp_err_t topic_err = RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART;
        if (md->topic_cnt == 1) {
            topic_err = md->topics[0].err;
            partitions = md->topics[0].partition_cnt;
        }
        rd_kafka_metadata_destroy(md);
        if (topic_err != RD_KAFKA_RESP_ERR_NO_ERROR || partitions == 0) {
            error = "outbox.progress_topic \"" + topic + "\" cannot be read: " +
                    rd_kafka_err2str(topic_err) +
                    " (create it with cleanup.policy=compact before outbox.delivery = "
                    "exactly_once, and allow the relay's principal to read and write it)";
            return false;
        }

        rd_kafka_topic_partition_list_t *list = rd_kafka_topic_partition_list_new(partitions);
        for (int i = 0; i < partitions; ++i)
            rd_kafka_topic_partition_list_add(list, topic.c_str(), i)->offset =
                RD_KAFKA_OFFSET_BEGINNING;
        err = rd_kafka_assign(rk.get(), list);
        rd_kafka_topic_partition_list_destroy(list);
        if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
            error = std::string("cannot read outbox.progress_topic: ") + rd_kafka_err2str(err);
            return false;
        }

        // A read_committed consumer reaches "the end" at the last stable
        // offset: the first record of a transaction still open (another
        // share's, or one a crash left until its relay's next start aborts
        // it). A committed record after it is not visible yet, so the end is
        // the high watermark the first fetch reports: EOF counts only once
        // the stable offset has reached it.
        std::vector<int64_t> target(static_cast<std::size_t>(partitions), -1);
        std::vector<char> at_end(static_cast<std::size_t>(partitions), 0);
        int ended = 0;
        while (ended < partitions) {
            int wait = std::min(left(), 100);
            if (wait <= 0) {
                error = "outbox.progress_topic \"" + topic + "\": its end was not reached within " +
                        std::to_string(timeout_ms) + " ms (a transaction still open on it?)" +
                        (errors.last.empty() ? "" : " (" + errors.last + ")");
                return false;
            }
            rd_kafka_message_t *m = rd_kafka_consumer_poll(rk.get(), wait);
            if (!m) continue;
            std::unique_ptr<rd_kafka_message_t, void (*)(rd_kafka_message_t *)> own_m(
                m, rd_kafka_message_destroy);
            if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
                int32_t p = m->partition;
                if (p < 0 || p >= partitions || at_end[p]) continue;
                if (target[p] < 0) {
                    int64_t lo = 0, hi = -1;
                    rd_kafka_get_watermark_offsets(rk.get(), topic.c_str(), p, &lo, &hi);
                    target[p] = hi;
                }
                if (m->offset >= target[p]) {
                    at_end[p] = 1;
                    ++ended;
                }
                continue;
            }
            if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
                if (m->err == RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED ||
                    m->err == RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED ||
                    m->err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART ||
                    m->err == RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC) {
                    error = "reading outbox.progress_topic \"" + topic +
                            "\": " + rd_kafka_err2str(m->err);
                    return false;
                }
                continue;  // passing: librdkafka retries
            }
            if (!m->key || m->key_len < prefix.size()) continue;
            std::string key(static_cast<const char *>(m->key), m->key_len);
            if (key.compare(0, prefix.size(), prefix) != 0) continue;
            if (!m->payload) {
                last[key].erase(m->partition);  // a tombstone
                continue;
            }
            last[key][m->partition] = std::string(static_cast<const char *>(m->payload), m->len);
        }
        return true;
    } catch (const std::exception &e) {
        error = e.what();
        return false;
    }
}

}  // namespace outbox::kafka
