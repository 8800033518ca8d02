// The project's test broker: a real Kafka-protocol broker cluster on
// loopback, built on librdkafka's mock cluster (rdkafka_mock.h), with a
// control socket for fault injection.  Tests, the demo and the benchmarks
// use it; the extension itself never does (it talks to whatever
// outbox.brokers names).
//
//   outbox_test_broker [--brokers N] [--topic NAME[:PARTITIONS]]...
//                      [--bootstrap-file PATH] [--control PATH]
//       Starts N brokers (default 1), creates the topics (default 4
//       partitions; unknown topics are auto-created with 4), prints the
//       bootstrap servers on the first line of stdout and in PATH, and
//       runs until SIGTERM or SIGINT.
//
//   outbox_test_broker ctl PATH COMMAND [ARGS...]
//       Sends one command to a running broker's control socket and prints
//       the answer.  Exit status 0 when the answer starts with "ok".
//
// Control commands (one per line; the answer is "ok ..." or "error ..."):
//   ping
//   down [ID|all]                 brokers drop connections and refuse new ones
//   up [ID|all]                   and accept them again
//   rtt MS [ID|all]               add MS of latency to every response
//   produce-errors ERR COUNT      the next COUNT Produce requests fail with ERR,
//                                 an error name as librdkafka prints it
//                                 (NOT_LEADER_FOR_PARTITION, _TRANSPORT, ...)
//   clear-errors                  forget pending injected Produce errors
//   topic-create NAME PARTITIONS
//   topic-error NAME ERR          metadata for NAME answers ERR
//                                 (UNKNOWN_TOPIC_OR_PART: as if auto-create were off)

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

volatile sig_atomic_t stop_requested = 0;

void on_signal(int) { stop_requested = 1; }

[[noreturn]] void usage(const char *why) {
    std::fprintf(stderr,
                 "outbox_test_broker: %s\n"
                 "usage: outbox_test_broker [--brokers N] [--topic NAME[:PARTITIONS]]... "
                 "[--bootstrap-file PATH] [--control PATH]\n"
                 "       outbox_test_broker ctl PATH COMMAND [ARGS...]\n",
                 why);
    std::exit(2);
}

bool parse_error_name(const std::string &name, rd_kafka_resp_err_t *out) {
    const struct rd_kafka_err_desc *descs;
    size_t n;
    rd_kafka_get_err_descs(&descs, &n);
    for (size_t i = 0; i < n; i++) {
        if (descs[i].name && name == descs[i].name) {
            *out = descs[i].code;
            return true;
        }
    }
    return false;
}

int32_t parse_broker_id(const std::vector<std::string> &args, size_t at) {
    if (args.size() <= at || args[at] == "all") return -1;
    return static_cast<int32_t>(std::atoi(args[at].c_str()));
}

std::string run_command(rd_kafka_mock_cluster_t *mc, const std::string &line) {
    std::istringstream in(line);
    std::vector<std::string> args;
    for (std::string w; in >> w;) args.push_back(w);
    if (args.empty()) return "error empty command";
    const std::string &cmd = args[0];
    rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;

    if (cmd == "ping") return std::string("ok ") + rd_kafka_mock_cluster_bootstraps(mc);
    if (cmd == "down") {
        err = rd_kafka_mock_broker_set_down(mc, parse_broker_id(args, 1));
    } else if (cmd == "up") {
        err = rd_kafka_mock_broker_set_up(mc, parse_broker_id(args, 1));
    } else if (cmd == "rtt") {
        if (args.size() < 2) return "error usage: rtt MS [ID|all]";
        err = rd_kafka_mock_broker_set_rtt(mc, parse_broker_id(args, 2), std::atoi(args[1].c_str()));
    } else if (cmd == "produce-errors") {
        if (args.size() != 3) return "error usage: produce-errors ERR COUNT";
        rd_kafka_resp_err_t code;
        if (!parse_error_name(args[1], &code)) return "error unknown error name " + args[1];
        size_t count = std::strtoul(args[2].c_str(), nullptr, 10);
        std::vector<rd_kafka_resp_err_t> errs(count, code);
        rd_kafka_mock_push_request_errors_array(mc, 0 /* Produce */, count, errs.data());
    } else if (cmd == "clear-errors") {
        rd_kafka_mock_clear_request_errors(mc, 0 /* Produce */);
    } else if (cmd == "topic-create") {
        if (args.size() != 3) return "error usage: topic-create NAME PARTITIONS";
        err = rd_kafka_mock_topic_create(mc, args[1].c_str(), std::atoi(args[2].c_str()), 1);
    } else if (cmd == "topic-error") {
        if (args.size() != 3) return "error usage: topic-error NAME ERR";
        rd_kafka_resp_err_t code;
        if (!parse_error_name(args[2], &code)) return "error unknown error name " + args[2];
        rd_kafka_mock_topic_set_error(mc, args[1].c_str(), code);
    } else {
        return "error unknown command " + cmd;
    }
    if (err) return std::string("error ") + rd_kafka_err2str(err);
    return "ok";
}

// Real Kafka brokers set TCP_NODELAY on their connections; the mock cluster
// does not, and with Nagle's algorithm on its side a response written while
// another is unacknowledged waits for the client's delayed ACK (40 ms on
// Linux) - a latency no real broker has.  We cannot reach the mock's
// sockets through its API, so we set the option on every TCP socket of this
// process: the listeners (accepted connections inherit it) and, on each
// pass, connections accepted since.
void disable_nagle_everywhere() {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return;
    while (dirent *e = readdir(d)) {
        int fd = std::atoi(e->d_name);
        if (fd <= 2) continue;
        int type = 0;
        socklen_t len = sizeof type;
        if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) continue;
        sockaddr_storage addr{};
        socklen_t alen = sizeof addr;
        if (getsockname(fd, reinterpret_cast<sockaddr *>(&addr), &alen) != 0) continue;
        if (addr.ss_family != AF_INET && addr.ss_family != AF_INET6) continue;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    closedir(d);
}

int open_control_socket(const std::string &path) {
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof addr.sun_path) usage("control socket path too long");
    std::strcpy(addr.sun_path, path.c_str());
    unlink(path.c_str());
    if (bind(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr) != 0 || listen(fd, 8) != 0) {
        std::perror("outbox_test_broker: control socket");
        std::exit(1);
    }
    return fd;
}

void serve_client(rd_kafka_mock_cluster_t *mc, int client) {
    std::string buf;
    char chunk[512];
    for (;;) {
        ssize_t n = read(client, chunk, sizeof chunk);
        if (n <= 0) break;
        buf.append(chunk, static_cast<size_t>(n));
        size_t nl;
        while ((nl = buf.find('\n')) != std::string::npos) {
            std::string answer = run_command(mc, buf.substr(0, nl)) + "\n";
            buf.erase(0, nl + 1);
            if (write(client, answer.data(), answer.size()) < 0) return;
        }
    }
}

int ctl_main(int argc, char **argv) {
    if (argc < 4) usage("ctl needs PATH and COMMAND");
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, argv[2], sizeof addr.sun_path - 1);
    if (connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr) != 0) {
        std::perror("outbox_test_broker ctl: connect");
        return 1;
    }
    std::string line;
    for (int i = 3; i < argc; i++) line += std::string(i > 3 ? " " : "") + argv[i];
    line += "\n";
    if (write(fd, line.data(), line.size()) < 0) return 1;
    shutdown(fd, SHUT_WR);
    std::string answer;
    char chunk[512];
    ssize_t n;
    while ((n = read(fd, chunk, sizeof chunk)) > 0) answer.append(chunk, static_cast<size_t>(n));
    std::cout << answer;
    return answer.rfind("ok", 0) == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc > 1 && std::strcmp(argv[1], "ctl") == 0) return ctl_main(argc, argv);

    int brokers = 1;
    std::vector<std::pair<std::string, int>> topics;
    std::string bootstrap_file, control_path;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) usage(("missing value for " + a).c_str());
            return argv[++i];
        };
        if (a == "--brokers") {
            brokers = std::atoi(value().c_str());
        } else if (a == "--topic") {
            std::string t = value();
            size_t colon = t.find(':');
            int parts = colon == std::string::npos ? 4 : std::atoi(t.c_str() + colon + 1);
            topics.emplace_back(t.substr(0, colon), parts);
        } else if (a == "--bootstrap-file") {
            bootstrap_file = value();
        } else if (a == "--control") {
            control_path = value();
        } else {
            usage(("unknown argument " + a).c_str());
        }
    }
    if (brokers < 1) usage("--brokers must be at least 1");

    char errstr[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "log_level", "3", errstr, sizeof errstr);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr);
    if (!rk) {
        std::fprintf(stderr, "outbox_test_broker: %s\n", errstr);
        return 1;
    }
    rd_kafka_mock_cluster_t *mc = rd_kafka_mock_cluster_new(rk, brokers);
    if (!mc) {
        std::fprintf(stderr, "outbox_test_broker: could not create the mock cluster\n");
        return 1;
    }
    for (auto &t : topics) {
        rd_kafka_resp_err_t err = rd_kafka_mock_topic_create(mc, t.first.c_str(), t.second, 1);
        if (err) {
            std::fprintf(stderr, "outbox_test_broker: topic %s: %s\n", t.first.c_str(),
                         rd_kafka_err2str(err));
            return 1;
        }
    }

    const char *bootstraps = rd_kafka_mock_cluster_bootstraps(mc);
    if (!bootstrap_file.empty()) {
        std::string tmp = bootstrap_file + ".tmp";
        std::ofstream(tmp) << bootstraps << "\n";
        std::rename(tmp.c_str(), bootstrap_file.c_str());  // readers never see half a line
    }
    std::printf("%s\n", bootstraps);
    std::fflush(stdout);

    struct sigaction sa{};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
    signal(SIGPIPE, SIG_IGN);

    int control = control_path.empty() ? -1 : open_control_socket(control_path);
    disable_nagle_everywhere();
    while (!stop_requested) {
        disable_nagle_everywhere();
        if (control < 0) {
            usleep(200 * 1000);
            continue;
        }
        pollfd p{control, POLLIN, 0};
        if (poll(&p, 1, 200) > 0) {
            int client = accept(control, nullptr, nullptr);
            if (client >= 0) {
                serve_client(mc, client);
                close(client);
            }
        }
    }

    if (control >= 0) unlink(control_path.c_str());
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(rk);
    return 0;
}
