// outbox.wait_for_standbys: which streaming standbys must hold a batch's
// WAL before the relay produces it, so that a failover to one of them never
// leaves Kafka with a message the promoted server lacks (a phantom event).
// Pure C++: the GUC check hook, the relay and the unit tests share it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace outbox::standby {

// Postgres' synchronous_standby_names, as the server parsed it: FIRST n
// (priority: the n connected members listed first must hold it) or ANY n
// (quorum: any n members).  Members compare without regard to case, as
// Postgres compares them; "*" matches every standby.  No member: nothing to
// wait for (Postgres' commits do not wait either).
struct SyncRule {
    bool quorum = false;
    int num_sync = 0;
    std::vector<std::string> members;
};

// What the setting asks for.  Empty text: nothing (the relay does not wait).
// "*": any one standby.  "synchronous_standby_names": the standbys that
// setting makes synchronous, by its own rule (`rule`, filled in by the
// caller from the server's parsed setting).  Otherwise a comma-separated
// list of standbys' application_name (primary_conninfo's application_name,
// or the cluster name, as pg_stat_replication shows it): every one listed.
struct Required {
    bool any = false;
    bool sync = false;
    std::vector<std::string> names;
    SyncRule rule;
    bool none() const { return !any && !sync && names.empty(); }
};

// The word that makes the setting follow synchronous_standby_names.
inline constexpr std::string_view kSyncWord = "synchronous_standby_names";

// Parses the setting's text.  Refuses "*" or "synchronous_standby_names"
// beside names, an empty item, a name listed twice or one longer than
// Postgres keeps (63 bytes).
bool parse(std::string_view text, Required &out, std::string &error) noexcept;

// One physical walsender as the primary sees it: the standby's name and the
// position (written, flushed or replayed: outbox.standby_lsn) it reported.
struct Standby {
    std::string_view name;
    std::uint64_t lsn;
};

// Whether the standbys hold every byte of WAL up to `target`.  When they do
// not, `why` says which standby is missing or behind and by how much, for
// the log and outbox.worker_stats ("standby \"b\" has flushed 0/3000060,
// the batch needs 0/3000148").  `verb` is "written", "flushed" or
// "replayed".
bool hold(const Required &required, const std::vector<Standby> &standbys, std::uint64_t target,
          const char *verb, std::string &why) noexcept;

// An LSN as Postgres prints it: "16/B374D848".
std::string lsn_text(std::uint64_t lsn);

}  // namespace outbox::standby
