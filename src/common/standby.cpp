#include "outbox/pure_tu.h"
#include "outbox/common/standby.h"

#include <cstdio>

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
        for (const std::string &item : items)
            if (item == "*") {
                error = "\"*\" (any standby) cannot be listed beside names";
                return false;
            }
        return parse_name_list(text, kMaxStandbys, kMaxName, out.names, error);
    } catch (const std::exception &e) {
        error = e.what();
        return false;
    }
}

bool hold(const Required &required, const std::vector<Standby> &standbys, std::uint64_t target,
          const char *verb, std::string &why) noexcept {
    try {
        why.clear();
        if (required.none()) return true;
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
