#include <string>
#include <vector>

#include "outbox/common/list.h"

#include "outbox/workers.h"

#include "outbox/guc.h"

extern "C" {
#include "postmaster/bgworker.h"
}

namespace {

char databases[kOutboxMaxDatabases][NAMEDATALEN];
int ndatabases = -1;

// Parses outbox.database once (its check hook has validated it).
bool parse_databases(const char *value) noexcept {
    try {
        std::vector<std::string> names;
        std::string error;
        if (!outbox::parse_name_list(value, kOutboxMaxDatabases, NAMEDATALEN - 1, names, error))
            return false;
        for (std::size_t i = 0; i < names.size(); i++)
            strlcpy(databases[i], names[i].c_str(), NAMEDATALEN);
        ndatabases = static_cast<int>(names.size());
        return true;
    } catch (...) {
        return false;
    }
}

void load_databases() {
    if (ndatabases >= 0) return;
    if (!parse_databases(outbox_database ? outbox_database : "")) ndatabases = 0;
}

int per_database() {
    return outbox_workers + 1 + (outbox_inbox ? 1 + outbox_inbox_workers : 0);
}

// Offset of each role's first slot within a database's block.
int role_offset(OutboxWorkerRole role) {
    switch (role) {
        case OUTBOX_ROLE_RELAY: return 0;
        case OUTBOX_ROLE_MAINTENANCE: return outbox_workers;
        case OUTBOX_ROLE_INBOX_CONSUMER: return outbox_workers + 1;
        case OUTBOX_ROLE_INBOX_HANDLER: return outbox_workers + 2;
    }
    return 0;
}

// The one table of worker roles: what each is called and where it starts.
const struct {
    OutboxWorkerRole role;
    const char *name;           // outbox.worker_stats.role; the process is "pg outbox <name>"
    const char *main_function;  // bgw_function_name
} kRoles[] = {
    {OUTBOX_ROLE_RELAY, "relay", "outbox_relay_main"},
    {OUTBOX_ROLE_MAINTENANCE, "maintenance", "outbox_maintenance_main"},
    {OUTBOX_ROLE_INBOX_CONSUMER, "inbox consumer", "outbox_inbox_consumer_main"},
    {OUTBOX_ROLE_INBOX_HANDLER, "inbox handler", "outbox_inbox_handler_main"},
};

const char *role_function(OutboxWorkerRole role) {
    for (const auto &r : kRoles)
        if (r.role == role) return r.main_function;
    return "";
}

void register_one(OutboxWorkerRole role, int d, int share) {
    BackgroundWorker worker;
    memset(&worker, 0, sizeof worker);
    if (outbox_shares(role) > 1)
        snprintf(worker.bgw_name, BGW_MAXLEN, "pg outbox %s %d for database %s",
                 outbox_role_name(role), share + 1, outbox_database_name(d));
    else
        snprintf(worker.bgw_name, BGW_MAXLEN, "pg outbox %s for database %s",
                 outbox_role_name(role), outbox_database_name(d));
    snprintf(worker.bgw_type, BGW_MAXLEN, "pg outbox %s", outbox_role_name(role));
    worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
    // Only on a primary: on a standby the workers start after promotion.
    worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
    // A worker that ends (an ERROR, pg_terminate_backend, a crash) is back
    // this many seconds later.
    worker.bgw_restart_time = 2;
    snprintf(worker.bgw_library_name, BGW_MAXLEN, "outbox");
    snprintf(worker.bgw_function_name, BGW_MAXLEN, "%s", role_function(role));
    worker.bgw_main_arg = Int32GetDatum(outbox_slot_of(role, d, share));
    RegisterBackgroundWorker(&worker);
}

}  // namespace

const char *outbox_role_name(int role) {
    for (const auto &r : kRoles)
        if (r.role == role) return r.name;
    return "unknown";
}

int outbox_database_count(void) {
    load_databases();
    return ndatabases;
}

const char *outbox_database_name(int index) {
    load_databases();
    return index >= 0 && index < ndatabases ? databases[index] : "";
}

int outbox_shares(OutboxWorkerRole role) {
    switch (role) {
        case OUTBOX_ROLE_RELAY: return outbox_workers;
        case OUTBOX_ROLE_INBOX_HANDLER: return outbox_inbox_workers;
        default: return 1;
    }
}

int outbox_slot_of(OutboxWorkerRole role, int database_index, int share) {
    return database_index * per_database() + role_offset(role) + share;
}

void outbox_slot_identity(int slot, OutboxWorkerRole *role, int *database_index, int *share) {
    *database_index = slot / per_database();
    int offset = slot % per_database();
    const OutboxWorkerRole roles[] = {OUTBOX_ROLE_INBOX_HANDLER, OUTBOX_ROLE_INBOX_CONSUMER,
                                      OUTBOX_ROLE_MAINTENANCE, OUTBOX_ROLE_RELAY};
    for (OutboxWorkerRole r : roles) {
        if (!outbox_inbox && (r == OUTBOX_ROLE_INBOX_HANDLER || r == OUTBOX_ROLE_INBOX_CONSUMER))
            continue;
        if (offset >= role_offset(r)) {
            *role = r;
            *share = offset - role_offset(r);
            return;
        }
    }
    *role = OUTBOX_ROLE_RELAY;
    *share = 0;
}

int outbox_slot_count(void) { return outbox_database_count() * per_database(); }

void outbox_register_workers(void) {
    for (int d = 0; d < outbox_database_count(); d++) {
        for (int w = 0; w < outbox_workers; w++) register_one(OUTBOX_ROLE_RELAY, d, w);
        register_one(OUTBOX_ROLE_MAINTENANCE, d, 0);
        if (outbox_inbox) {
            register_one(OUTBOX_ROLE_INBOX_CONSUMER, d, 0);
            for (int h = 0; h < outbox_inbox_workers; h++)
                register_one(OUTBOX_ROLE_INBOX_HANDLER, d, h);
        }
    }
}

bool outbox_serves_this_database(void) {
    if (!outbox_preloaded) return false;
    const char *name = get_database_name(MyDatabaseId);
    for (int d = 0; name && d < outbox_database_count(); d++)
        if (strcmp(outbox_database_name(d), name) == 0) return true;
    return false;
}
