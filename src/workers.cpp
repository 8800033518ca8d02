#include "outbox/workers.h"

#include "outbox/guc.h"
#include "outbox/shmem.h"

extern "C" {
#include "postmaster/bgworker.h"
}

namespace {

char databases[kOutboxMaxDatabases][NAMEDATALEN];
int ndatabases = -1;

void load_databases() {
    if (ndatabases >= 0) return;
    const char *why = nullptr;
    int n = 0;
    // The GUC check hook has validated the value already.
    if (!outbox_parse_database_list(outbox_database ? outbox_database : "", databases, &n, &why))
        n = 0;
    ndatabases = n;
}

void register_one(const char *type, const char *function, int slot, const char *dbname) {
    BackgroundWorker worker;
    memset(&worker, 0, sizeof worker);
    snprintf(worker.bgw_name, BGW_MAXLEN, "%s for database %s", type, dbname);
    snprintf(worker.bgw_type, BGW_MAXLEN, "%s", type);
    worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
    // Only on a primary: on a standby the workers start after promotion.
    worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
    worker.bgw_restart_time = 5;
    snprintf(worker.bgw_library_name, BGW_MAXLEN, "outbox");
    snprintf(worker.bgw_function_name, BGW_MAXLEN, "%s", function);
    worker.bgw_main_arg = Int32GetDatum(slot);
    RegisterBackgroundWorker(&worker);
}

}  // namespace

bool outbox_parse_database_list(const char *value, char names[][NAMEDATALEN], int *count,
                                const char **why) {
    int n = 0;
    const char *p = value;
    for (;;) {
        while (*p == ' ' || *p == '\t') p++;
        const char *start = p;
        while (*p && *p != ',') p++;
        const char *end = p;
        while (end > start && (end[-1] == ' ' || end[-1] == '\t')) end--;
        std::size_t len = static_cast<std::size_t>(end - start);
        if (len == 0) {
            *why = "a database name in the list is empty";
            return false;
        }
        if (len >= NAMEDATALEN) {
            *why = "a database name is longer than 63 bytes";
            return false;
        }
        if (n == kOutboxMaxDatabases) {
            *why = "at most 16 databases can be listed";
            return false;
        }
        memcpy(names[n], start, len);
        names[n][len] = '\0';
        for (int i = 0; i < n; i++)
            if (strcmp(names[i], names[n]) == 0) {
                *why = "a database is listed twice";
                return false;
            }
        n++;
        if (*p == '\0') break;
        p++;  // the comma
    }
    *count = n;
    return true;
}

int outbox_database_count(void) {
    load_databases();
    return ndatabases;
}

const char *outbox_database_name(int index) {
    load_databases();
    return index >= 0 && index < ndatabases ? databases[index] : "";
}

int outbox_relay_slot(int database_index, int share) {
    return database_index * outbox_workers + share;
}

int outbox_maintenance_slot(int database_index) {
    return outbox_database_count() * outbox_workers + database_index;
}

int outbox_inbox_consumer_slot(int database_index) {
    return outbox_database_count() * (outbox_workers + 1) + database_index;
}

int outbox_inbox_handler_slot(int database_index) {
    return outbox_database_count() * (outbox_workers + 2) + database_index;
}

void outbox_relay_of_slot(int slot, int *database_index, int *share) {
    *database_index = slot / outbox_workers;
    *share = slot % outbox_workers;
}

int outbox_slot_count(void) { return outbox_database_count() * (outbox_workers + 3); }

void outbox_register_workers(void) {
    for (int d = 0; d < outbox_database_count(); d++) {
        for (int w = 0; w < outbox_workers; w++)
            register_one("pg outbox relay", "outbox_relay_main", outbox_relay_slot(d, w),
                         outbox_database_name(d));
        register_one("pg outbox maintenance", "outbox_maintenance_main",
                     outbox_maintenance_slot(d), outbox_database_name(d));
        if (outbox_inbox) {
            register_one("pg outbox inbox consumer", "outbox_inbox_consumer_main",
                         outbox_inbox_consumer_slot(d), outbox_database_name(d));
            register_one("pg outbox inbox handler", "outbox_inbox_handler_main",
                         outbox_inbox_handler_slot(d), outbox_database_name(d));
        }
    }
}
