#include "outbox/pure_tu.h"
#include "outbox/kafka/config.h"

#include <librdkafka/rdkafka.h>

#include <sys/stat.h>
#include <cerrno>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>

namespace outbox::kafka {

bool report_error(char *err, std::size_t errlen, const char *message) noexcept {
    if (err && errlen > 0) std::snprintf(err, errlen, "%s", message ? message : "");
    return false;
}

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// One token under construction: `keep` is the length up to and including
// the last escaped character, which trailing-space trimming must not eat.
struct Token {
    std::string text;
    std::size_t keep = 0;
    void add(char c, bool escaped) {
        if (text.empty() && !escaped && is_space(c)) return;  // leading space
        text.push_back(c);
        if (escaped) keep = text.size();
    }
    std::string finish() {
        std::size_t end = text.size();
        while (end > keep && is_space(text[end - 1])) --end;
        text.resize(end);
        std::string out;
        out.swap(text);
        keep = 0;
        return out;
    }
};

// A Kerberos name or keytab path librdkafka puts into its kinit command,
// which a shell runs: only characters no shell gives a meaning to.
bool shell_inert(const std::string &v) {
    for (char c : v)
        if (!std::isalnum(static_cast<unsigned char>(c)) && !std::strchr("@._/+=:,-", c))
            return false;
    return true;
}

// Properties that make librdkafka run or load code of the setting's
// choosing, in the workers (the bootstrap superuser) or in whichever backend
// checks the setting: whoever may set one would be a superuser in effect.
const char *runs_code(const Property &p) {
    std::string n = p.name;
    for (char &c : n) c = c == '_' ? '.' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (n == "plugin.library.paths")
        return "plugin.library.paths loads a shared library into the server: it is refused";
    if (n == "sasl.kerberos.kinit.cmd")
        return "sasl.kerberos.kinit.cmd runs a shell command in the workers: it is refused (run "
               "kinit outside the server, and set sasl.kerberos.min.time.before.relogin=0)";
    if (n == "ssl.engine.location" || n == "ssl.providers")
        return "ssl.engine.location and ssl.providers load code into the server: they are "
               "refused";
    if ((n == "sasl.kerberos.principal" || n == "sasl.kerberos.keytab" ||
         n == "sasl.kerberos.service.name") &&
        !shell_inert(p.value))
        return "sasl.kerberos.principal, .keytab and .service.name go into the kinit command a "
               "shell runs: only letters, digits and @._/+=:,- are accepted";
    return nullptr;
}

// Properties the relay sets itself, whose other values would break the
// delivery guarantees, or that run code; nullptr when `p` may be set.
const char *forbidden(const Property &p) {
    if (const char *why = runs_code(p)) return why;
    const std::string &n = p.name;
    if (n == "bootstrap.servers" || n == "metadata.broker.list")
        return "set outbox.brokers instead of bootstrap.servers in outbox.kafka_config";
    if (n == "enable.idempotence" && p.value != "true")
        return "enable.idempotence must stay true: the relay relies on it for per-key order";
    if ((n == "acks" || n == "request.required.acks") && p.value != "all" && p.value != "-1")
        return "acks must stay \"all\": a message is marked published only once every in-sync "
               "replica has it";
    if (n == "transactional.id")
        return "transactional.id is set by the relay itself: set outbox.delivery = exactly_once";
    if (n == "log.queue") return "log.queue is set by the relay itself";
    return nullptr;
}

// librdkafka's message about a refused value, with the value itself taken
// out (it may quote it).
std::string without_value(std::string text, const std::string &value) {
    if (value.size() < 2) return text;
    for (std::size_t at; (at = text.find(value)) != std::string::npos;)
        text.replace(at, value.size(), "(value not shown)");
    return text;
}

// The checks shared by outbox.kafka_config and the secrets file: rules,
// then librdkafka's own validation.  `error` names the property only.
bool check_one(rd_kafka_conf_t *conf, const Property &p, std::string &error) {
    if (const char *why = forbidden(p)) {
        error = why;
        return false;
    }
    char rk_err[512];
    if (rd_kafka_conf_set(conf, p.name.c_str(), p.value.c_str(), rk_err, sizeof rk_err) !=
        RD_KAFKA_CONF_OK) {
        // librdkafka names the canonical property, which may be an alias of
        // what the user wrote: say both.
        error = "\"" + p.name + "\": " + without_value(rk_err, p.value);
        return false;
    }
    return true;
}

std::string trim(const std::string &s) {
    std::size_t b = 0, e = s.size();
    while (b < e && is_space(s[b])) ++b;
    while (e > b && is_space(s[e - 1])) --e;
    return s.substr(b, e - b);
}

}  // namespace

bool parse_properties(std::string_view text, std::vector<Property> &out,
                      std::string &error) noexcept {
    try {
        out.clear();
        Token name, value;
        bool in_value = false;
        bool saw_anything = false;  // non-space content in this segment
        std::size_t segment = 1;
        auto end_segment = [&]() -> bool {
            if (!saw_anything) {  // empty segment, e.g. "a=1;;b=2" or a trailing ';'
                name.finish();
                value.finish();
                in_value = false;
                return true;
            }
            if (!in_value) {
                // Not the segment's text: it may be a password that lost its name.
                name.finish();
                error = "segment " + std::to_string(segment) + " has no '=': expected name=value";
                return false;
            }
            Property p{name.finish(), value.finish()};
            if (p.name.empty()) {
                error = "segment " + std::to_string(segment) + " has an empty property name";
                return false;
            }
            out.push_back(std::move(p));
            in_value = false;
            saw_anything = false;
            return true;
        };
        for (std::size_t i = 0; i < text.size(); ++i) {
            char c = text[i];
            bool escaped = false;
            if (c == '\\') {
                if (i + 1 == text.size()) {
                    error = "the text ends with a lone backslash";
                    return false;
                }
                c = text[++i];
                escaped = true;
            } else if (c == ';') {
                if (!end_segment()) return false;
                ++segment;
                continue;
            } else if (c == '=' && !in_value) {
                in_value = true;
                saw_anything = true;
                continue;
            }
            if (escaped || !is_space(c)) saw_anything = true;
            (in_value ? value : name).add(c, escaped);
        }
        return end_segment();
    } catch (const std::exception &e) {
        error = e.what();
        return false;
    }
}

bool set_property(rd_kafka_conf_t *conf, const char *name, const std::string &value,
                  std::string &error) noexcept {
    char errstr[512];
    if (rd_kafka_conf_set(conf, name, value.c_str(), errstr, sizeof errstr) != RD_KAFKA_CONF_OK) {
        try {
            error = errstr;
        } catch (...) {
        }
        return false;
    }
    return true;
}

bool is_producer_only_property(const std::string &name) noexcept {
    static const char *const names[] = {
        "enable.idempotence", "acks", "request.required.acks", "partitioner", "linger.ms",
        "queue.buffering.max.ms", "queue.buffering.max.messages", "queue.buffering.max.kbytes",
        "compression.type", "compression.codec", "compression.level", "message.timeout.ms",
        "delivery.timeout.ms", "max.in.flight.requests.per.connection", "max.in.flight",
        "retries", "message.send.max.retries", "retry.backoff.ms", "batch.num.messages",
        "batch.size", "sticky.partitioning.linger.ms", "enable.gapless.guarantee",
        "request.timeout.ms"};
    for (const char *n : names)
        if (name == n) return true;
    return false;
}

bool is_consumer_only_property(const std::string &name) noexcept {
    static const char *const names[] = {
        "group.id", "group.instance.id", "session.timeout.ms", "heartbeat.interval.ms",
        "max.poll.interval.ms", "auto.offset.reset", "enable.auto.commit",
        "auto.commit.interval.ms", "enable.auto.offset.store", "partition.assignment.strategy",
        "fetch.wait.max.ms", "fetch.min.bytes", "fetch.max.bytes", "fetch.message.max.bytes",
        "max.partition.fetch.bytes", "fetch.error.backoff.ms", "queued.min.messages",
        "queued.max.messages.kbytes", "isolation.level", "check.crcs", "allow.auto.create.topics",
        "enable.partition.eof", "group.protocol.type", "coordinator.query.interval.ms"};
    for (const char *n : names)
        if (name == n) return true;
    return false;
}

bool load_secrets_file(const char *path, std::vector<Property> &out, char *err,
                       std::size_t errlen) noexcept {
    try {
        out.clear();
        if (!path || !path[0]) return true;
        std::string error;
        if (load_properties_file(path, out, error)) return true;
        out.clear();
        return report_error(err, errlen, error);
    } catch (...) {
        return report_error(err, errlen, "out of memory");
    }
}

bool same_properties(const std::vector<Property> &a, const std::vector<Property> &b) noexcept {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); i++)
        if (a[i].name != b[i].name || a[i].value != b[i].value) return false;
    return true;
}

bool is_secret_property(const std::string &name) noexcept {
    // Every librdkafka property holding a password or a secret has one of
    // these words in its name; the rest hold key material or may embed one.
    if (name.find("password") != std::string::npos || name.find("secret") != std::string::npos)
        return true;
    static const char *const names[] = {"ssl.key.pem", "ssl_key", "sasl.oauthbearer.config"};
    for (const char *n : names)
        if (name == n) return true;
    return false;
}

bool check_properties(std::string_view text, char *errbuf, std::size_t errlen) noexcept {
    try {
        std::vector<Property> props;
        std::string error;
        if (!parse_properties(text, props, error)) {
            std::snprintf(errbuf, errlen, "%s", error.c_str());
            return false;
        }
        std::unique_ptr<rd_kafka_conf_t, void (*)(rd_kafka_conf_t *)> conf(rd_kafka_conf_new(),
                                                                           rd_kafka_conf_destroy);
        for (const Property &p : props) {
            if (is_secret_property(p.name)) {
                std::snprintf(errbuf, errlen,
                              "\"%s\" holds a secret, and any member of pg_read_all_settings "
                              "can read outbox.kafka_config: put it in the file named by "
                              "outbox.kafka_config_file",
                              p.name.c_str());
                return false;
            }
            if (!check_one(conf.get(), p, error)) {
                std::snprintf(errbuf, errlen, "%s", error.c_str());
                return false;
            }
        }
        return true;
    } catch (const std::exception &e) {
        std::snprintf(errbuf, errlen, "%s", e.what());
        return false;
    }
}

bool load_properties_file(const std::string &path, std::vector<Property> &out,
                          std::string &error) noexcept {
    try {
        out.clear();
        const std::string where = "outbox.kafka_config_file \"" + path + "\"";
        struct stat st;
        if (stat(path.c_str(), &st) != 0) {
            error = where + ": " + std::strerror(errno);
            return false;
        }
        if (!S_ISREG(st.st_mode)) {
            error = where + " is not a regular file";
            return false;
        }
        // As Postgres asks of ssl_key_file: owned by the server's user with
        // no access for group or others, or owned by root with at most read
        // access for the group.
        if (st.st_uid != geteuid() && st.st_uid != 0) {
            error = where + " must be owned by the user the server runs as, or by root";
            return false;
        }
        if ((st.st_uid == geteuid() && (st.st_mode & (S_IRWXG | S_IRWXO))) ||
            (st.st_uid == 0 && (st.st_mode & (S_IWGRP | S_IXGRP | S_IRWXO)))) {
            error = where + " has group or world access: it must be u=rw (0600) when owned by "
                            "the server's user, or u=rw,g=r (0640) when owned by root";
            return false;
        }
        std::ifstream in(path);
        if (!in) {
            error = where + ": cannot be read";
            return false;
        }
        std::unique_ptr<rd_kafka_conf_t, void (*)(rd_kafka_conf_t *)> conf(rd_kafka_conf_new(),
                                                                           rd_kafka_conf_destroy);
        std::string line;
        for (std::size_t number = 1; std::getline(in, line); ++number) {
            std::string t = trim(line);
            if (t.empty() || t[0] == '#') continue;
            std::size_t eq = t.find('=');
            std::string at = where + " line " + std::to_string(number);
            if (eq == std::string::npos) {
                error = at + " has no '=': expected name=value";
                return false;
            }
            Property p{trim(t.substr(0, eq)), trim(t.substr(eq + 1))};
            if (p.name.empty()) {
                error = at + " has an empty property name";
                return false;
            }
            std::string why;
            if (!check_one(conf.get(), p, why)) {
                error = at + ": " + why;
                return false;
            }
            out.push_back(std::move(p));
        }
        return true;
    } catch (const std::exception &e) {
        error = e.what();
        return false;
    }
}

}  // namespace outbox::kafka
