#include "outbox/pure_tu.h"
#include "outbox/common/standby.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "outbox/common/list.h"

namespace outbox::standby {

namespace {
// Postgres keeps application_name in NAMEDATALEN - 1 bytes.
constexpr std::size_t kMaxName = 63;
constexpr std::size_t kMaxStandbys = 64;
}  // namespace

std::string lsn_text(std::uint64_t lsn) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%X/%X", static_cast<unsigned>(lsn >> 32),
                  static_cast<unsigned>(lsn & 0xffffffffu));
    return buf;
}

bool parse(std::string_view text, Required &out, std::string &error) noexcept {
    try {
        out = Required{};
        std::vector<std::string> items;
        if (!split_list(text, items, error)) return false;
        if (items.empty()) return true;
        if (items.size() == 1 && items[0] == "*") {
            out.any = true;
            return true;
        }
        if (items.size() == 1 && items[0] == kSyncWord) {
            out.sync = true;
            return true;
        }
        for (const std::string &item : items) {
            if (item == "*") {
                error = "\"*\" (any standby) cannot be listed beside names";
                return false;
            }
            if (item == kSyncWord) {
                error = "\"synchronous_standby_names\" cannot be listed beside names";
                return false;
            }
        }
        return parse_name_list(text, kMaxStandbys, kMaxName, out.names, error);
    } catch (const std::exception &e) {
        error = e.what();
        return false;
    }
}

namespace {

bool same_name_ignoring_case(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); i++) {
        unsigned char x = static_cast<unsigned char>(a[i]), y = static_cast<unsigned char>(b[i]);
        if (x >= 'A' && x <= 'Z') x = static_cast<unsigned char>(x - 'A' + 'a');
        if (y >= 'A' && y <= 'Z') y = static_cast<unsigned char>(y - 'A' + 'a');
        if (x != y) return false;
    }
    return true;
}

// A standby's priority under synchronous_standby_names: the place of the
// first member that matches it (0 first), or -1 when none does.
int priority(const SyncRule &rule, std::string_view name) {
    for (std::size_t i = 0; i < rule.members.size(); i++)
        if (rule.members[i] == "*" || same_name_ignoring_case(rule.members[i], name))
            return static_cast<int>(i);
    return -1;
}

std::string how_many(int n) { return std::to_string(n) + (n == 1 ? " standby" : " standbys"); }

// synchronous_standby_names' own rule, on the batch's WAL instead of a
// commit: ANY n wants n of its members to hold it, FIRST n the n connected
// members of highest priority (ties: in the walsenders' order).
bool hold_sync(const SyncRule &rule, const std::vector<Standby> &standbys, std::uint64_t target,
               const char *verb, std::string &why) {
    if (rule.members.empty() || rule.num_sync <= 0) return true;
    std::vector<std::pair<int, const Standby *>> members;
    for (const Standby &s : standbys) {
        int p = priority(rule, s.name);
        if (p >= 0) members.emplace_back(p, &s);
    }
    std::string wants = "synchronous_standby_names wants " + std::string(rule.quorum ? "any " : "") +
                        how_many(rule.num_sync);
    if (static_cast<int>(members.size()) < rule.num_sync) {
        why = wants + "; " + std::to_string(members.size()) + " of its standbys " +
              (members.size() == 1 ? "is" : "are") + " connected";
        return false;
    }
    if (rule.quorum) {
        int holding = 0;
        for (const auto &m : members)
            if (m.second->lsn >= target) holding++;
        if (holding >= rule.num_sync) return true;
        why = wants + "; " + std::to_string(holding) + " of its " + how_many(static_cast<int>(members.size())) +
              " " + (holding == 1 ? "has" : "have") + " " + verb + " the batch's WAL (" +
              lsn_text(target) + ")";
        return false;
    }
    std::stable_sort(members.begin(), members.end(),
                     [](const auto &a, const auto &b) { return a.first < b.first; });
    for (int i = 0; i < rule.num_sync; i++) {
        const Standby &s = *members[static_cast<std::size_t>(i)].second;
        if (s.lsn < target) {
            why = wants + "; standby \"" + std::string(s.name) + "\" has " + verb + " " +
                  lsn_text(s.lsn) + ", the batch needs " + lsn_text(target);
            return false;
        }
    }
    return true;
}

}  // namespace

bool hold(const Required &required, const std::vector<Standby> &standbys, std::uint64_t target,
          const char *verb, std::string &why) noexcept {
    try {
        why.clear();
        if (required.none()) return true;
        if (required.sync) return hold_sync(required.rule, standbys, target, verb, why);
        if (required.any) {
            const Standby *best = nullptr;
            for (const Standby &s : standbys)
                if (!best || s.lsn > best->lsn) best = &s;
            if (best && best->lsn >= target) return true;
            why = best ? "no standby has " + std::string(verb) + " the batch's WAL yet: the " +
                             "furthest, \"" + std::string(best->name) + "\", has " + verb + " " +
                             lsn_text(best->lsn) + ", the batch needs " + lsn_text(target)
                       : "no standby is connected";
            return false;
        }
        for (const std::string &name : required.names) {
            const Standby *best = nullptr;
            for (const Standby &s : standbys)
                if (s.name == name && (!best || s.lsn > best->lsn)) best = &s;
            if (!best) {
                why = "standby \"" + name + "\" is not connected";
                return false;
            }
            if (best->lsn < target) {
                why = "standby \"" + name + "\" has " + verb + " " + lsn_text(best->lsn) +
                      ", the batch needs " + lsn_text(target);
                return false;
            }
        }
        return true;
    } catch (const std::exception &) {
        why = "out of memory";
        return false;
    }
}

}  // namespace outbox::standby
