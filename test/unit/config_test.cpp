#include "outbox/kafka/config.h"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

using outbox::kafka::check_properties;
using outbox::kafka::parse_properties;
using outbox::kafka::Property;

namespace {

std::vector<Property> parse_ok(const char *text) {
    std::vector<Property> out;
    std::string error;
    EXPECT_TRUE(parse_properties(text, out, error)) << text << ": " << error;
    return out;
}

std::string parse_error(const char *text) {
    std::vector<Property> out;
    std::string error;
    EXPECT_FALSE(parse_properties(text, out, error)) << text;
    return error;
}

std::string check_error(const char *text) {
    char err[512] = "";
    EXPECT_FALSE(check_properties(text, err, sizeof err)) << text;
    return err;
}

}  // namespace

TEST(KafkaConfig, EmptyIsNothing) {
    EXPECT_TRUE(parse_ok("").empty());
    EXPECT_TRUE(parse_ok("  ;; ; ").empty());
}

TEST(KafkaConfig, NamesAndValuesInOrder) {
    auto p = parse_ok("linger.ms=5;compression.type=lz4");
    ASSERT_EQ(p.size(), 2u);
    EXPECT_EQ(p[0].name, "linger.ms");
    EXPECT_EQ(p[0].value, "5");
    EXPECT_EQ(p[1].name, "compression.type");
    EXPECT_EQ(p[1].value, "lz4");
}

TEST(KafkaConfig, TrimsWhitespaceAndSkipsEmptySegments) {
    auto p = parse_ok("  security.protocol = SASL_SSL ;; sasl.mechanism=PLAIN ;");
    ASSERT_EQ(p.size(), 2u);
    EXPECT_EQ(p[0].name, "security.protocol");
    EXPECT_EQ(p[0].value, "SASL_SSL");
    EXPECT_EQ(p[1].value, "PLAIN");
}

TEST(KafkaConfig, ValueKeepsLaterEqualsSigns) {
    auto p = parse_ok("sasl.password=a=b==");
    ASSERT_EQ(p.size(), 1u);
    EXPECT_EQ(p[0].value, "a=b==");
}

TEST(KafkaConfig, BackslashEscapesSemicolonBackslashAndSpace) {
    auto p = parse_ok(R"(sasl.password=se\;cr\\et\ ;linger.ms=1)");
    ASSERT_EQ(p.size(), 2u);
    EXPECT_EQ(p[0].value, "se;cr\\et ");  // the escaped trailing space is kept
    EXPECT_EQ(p[1].name, "linger.ms");
}

TEST(KafkaConfig, EmptyValueIsAllowed) {
    auto p = parse_ok("sasl.password=");
    ASSERT_EQ(p.size(), 1u);
    EXPECT_EQ(p[0].value, "");
}

TEST(KafkaConfig, MissingEqualsNamesTheSegmentNotItsText) {
    std::string e = parse_error("linger.ms=5;compression.type");
    EXPECT_NE(e.find("segment 2"), std::string::npos) << e;
    // The text could be a password that lost its name.
    EXPECT_EQ(e.find("compression.type"), std::string::npos) << e;
}

TEST(KafkaConfig, EmptyNameIsAnError) {
    EXPECT_NE(parse_error("=5").find("empty property name"), std::string::npos);
}

TEST(KafkaConfig, LoneTrailingBackslashIsAnError) {
    EXPECT_NE(parse_error("a=b\\").find("backslash"), std::string::npos);
}

TEST(KafkaConfig, CheckAcceptsRealProperties) {
    char err[512];
    EXPECT_TRUE(check_properties("", err, sizeof err));
    EXPECT_TRUE(check_properties("linger.ms=5;compression.type=lz4;message.timeout.ms=60000",
                                 err, sizeof err))
        << err;
    EXPECT_TRUE(check_properties("acks=all;enable.idempotence=true", err, sizeof err)) << err;
}

TEST(KafkaConfig, CheckRejectsUnknownPropertyWithLibrdkafkasText) {
    std::string e = check_error("no.such.property=1");
    EXPECT_NE(e.find("no.such.property"), std::string::npos) << e;
}

TEST(KafkaConfig, CheckRejectsBadValue) {
    std::string e = check_error("linger.ms=soon");
    EXPECT_NE(e.find("linger.ms"), std::string::npos) << e;
}

TEST(KafkaConfig, CheckRejectsWhatWouldBreakTheGuarantees) {
    EXPECT_NE(check_error("bootstrap.servers=x:9092").find("outbox.brokers"), std::string::npos);
    EXPECT_NE(check_error("enable.idempotence=false").find("enable.idempotence"),
              std::string::npos);
    EXPECT_NE(check_error("acks=1").find("acks"), std::string::npos);
    EXPECT_NE(check_error("transactional.id=x").find("transactional.id"), std::string::npos);
}

// Whoever may set one of these (a role granted ALTER SYSTEM on
// outbox.kafka_config) would run code as the workers' superuser.
TEST(KafkaConfig, CheckRefusesWhatRunsCode) {
    EXPECT_NE(check_error("sasl.kerberos.kinit.cmd=touch /tmp/pwned").find("shell command"),
              std::string::npos);
    EXPECT_NE(check_error("sasl.kerberos.principal=x$(touch /tmp/pwned)").find("kinit"),
              std::string::npos);
    EXPECT_NE(check_error("sasl.kerberos.keytab=/tmp/k$(id)").find("kinit"), std::string::npos);
    EXPECT_NE(check_error("ssl.engine.location=/tmp/x.so").find("load code"), std::string::npos);
    EXPECT_NE(check_error("ssl.providers=/tmp/x.so").find("load code"), std::string::npos);
    // Refused before librdkafka would load it (its own error says it tried).
    char path[] = "/tmp/outbox-not-a-plugin.XXXXXX";
    int fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    close(fd);
    std::string e = check_error((std::string("plugin.library.paths=") + path).c_str());
    unlink(path);
    EXPECT_NE(e.find("loads a shared library"), std::string::npos) << e;
    EXPECT_NE(check_error("plugin_library_paths=/tmp/x").find("loads a shared library"),
              std::string::npos);
}

TEST(KafkaConfig, CheckReportsSyntaxErrors) {
    EXPECT_NE(check_error("linger.ms").find("no '='"), std::string::npos);
}

// ---- secrets ----

TEST(KafkaSecrets, SecretPropertiesAreRefusedWithoutTheirValue) {
    for (const char *text : {"sasl.password=hunter2secret", "ssl.key.password=hunter2secret",
                             "sasl.oauthbearer.client.secret=hunter2secret",
                             "ssl.key.pem=hunter2secret"}) {
        std::string e = check_error(text);
        EXPECT_NE(e.find("outbox.kafka_config_file"), std::string::npos) << e;
        EXPECT_EQ(e.find("hunter2secret"), std::string::npos) << e;
    }
}

TEST(KafkaSecrets, NoErrorRepeatsAValue) {
    // A misspelt name, a value without its name, a bad value: never echoed.
    for (const char *text : {"sasl.pasword=hunter2secret", "hunter2secret",
                             "security.protocol=hunter2secret", "a=1;hunter2secret;b=2"}) {
        std::string e = check_error(text);
        EXPECT_EQ(e.find("hunter2secret"), std::string::npos) << text << ": " << e;
    }
}

TEST(KafkaSecrets, IsSecret) {
    EXPECT_TRUE(outbox::kafka::is_secret_property("sasl.password"));
    EXPECT_TRUE(outbox::kafka::is_secret_property("ssl.keystore.password"));
    EXPECT_FALSE(outbox::kafka::is_secret_property("sasl.username"));
    EXPECT_FALSE(outbox::kafka::is_secret_property("security.protocol"));
}

namespace {

struct SecretsFile {
    std::string path;
    explicit SecretsFile(const std::string &text, mode_t mode = 0600) {
        char name[] = "/tmp/outbox-secrets-XXXXXX";
        int fd = mkstemp(name);
        EXPECT_GE(fd, 0);
        EXPECT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
        close(fd);
        chmod(name, mode);
        path = name;
    }
    ~SecretsFile() { unlink(path.c_str()); }
};

}  // namespace

TEST(KafkaSecrets, FileGivesPropertiesLineByLine) {
    SecretsFile f("# Kafka credentials\n\nsasl.username = outbox\nsasl.password = s3cr;et\\x = y\n"
                  "security.protocol=SASL_PLAINTEXT\n");
    std::vector<Property> props;
    std::string error;
    ASSERT_TRUE(outbox::kafka::load_properties_file(f.path, props, error)) << error;
    ASSERT_EQ(props.size(), 3u);
    EXPECT_EQ(props[1].name, "sasl.password");
    EXPECT_EQ(props[1].value, "s3cr;et\\x = y");  // taken as it is
}

TEST(KafkaSecrets, FileRefusesWhatRunsCode) {
    SecretsFile f("sasl.kerberos.kinit.cmd=touch /tmp/pwned\n");
    std::vector<Property> props;
    std::string error;
    EXPECT_FALSE(outbox::kafka::load_properties_file(f.path, props, error));
    EXPECT_NE(error.find("shell command"), std::string::npos) << error;
}

TEST(KafkaSecrets, FileReadableByOthersIsRefused) {
    SecretsFile f("sasl.password=hunter2secret\n", 0644);
    std::vector<Property> props;
    std::string error;
    EXPECT_FALSE(outbox::kafka::load_properties_file(f.path, props, error));
    EXPECT_NE(error.find("group or world access"), std::string::npos) << error;
    EXPECT_TRUE(props.empty());
}

TEST(KafkaSecrets, FileErrorsNameTheLineNeverTheValue) {
    SecretsFile a("sasl.username=u\nhunter2secret\n");
    std::vector<Property> props;
    std::string error;
    EXPECT_FALSE(outbox::kafka::load_properties_file(a.path, props, error));
    EXPECT_NE(error.find("line 2"), std::string::npos) << error;
    EXPECT_EQ(error.find("hunter2secret"), std::string::npos) << error;
    SecretsFile b("security.protocol=hunter2secret\n");
    EXPECT_FALSE(outbox::kafka::load_properties_file(b.path, props, error));
    EXPECT_NE(error.find("security.protocol"), std::string::npos) << error;
    EXPECT_EQ(error.find("hunter2secret"), std::string::npos) << error;
    EXPECT_FALSE(outbox::kafka::load_properties_file("/nonexistent/outbox.secrets", props, error));
    EXPECT_NE(error.find("/nonexistent/outbox.secrets"), std::string::npos) << error;
}
