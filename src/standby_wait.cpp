// outbox.wait_for_standbys: see outbox/standby_wait.h.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "outbox/common/standby.h"

#include "outbox/guc.h"
#include "outbox/standby_wait.h"

extern "C" {
#include "access/xlog.h"
#include "replication/syncrep.h"
#include "replication/walsender.h"
#include "replication/walsender_private.h"
#include "storage/spin.h"
#include "utils/memutils.h"
}

namespace {

// A walsender the relay has seen: whether it serves a physical standby (a
// logical one is connected to a database) and the standby's name.
struct KnownSender {
    pid_t pid;
    bool physical;
    char name[NAMEDATALEN];
};

// A standby's position as the check reads it.
struct Position {
    char name[NAMEDATALEN];
    uint64 lsn;
};

// synchronous_standby_names as the server parsed it (SyncRepConfig), for
// outbox.wait_for_standbys = 'synchronous_standby_names'.
struct SyncNames {
    bool quorum = false;
    int num_sync = 0;
    int nmembers = 0;
    const char *members = nullptr;  // nmembers consecutive NUL-terminated names
};

KnownSender *known = nullptr;  // max_wal_senders entries, TopMemoryContext
int known_n = 0;
Position *positions = nullptr;

// ---- C++ side: never calls Postgres, never throws ----

bool required_cpp(const char *setting) noexcept {
    try {
        outbox::standby::Required required;
        std::string error;
        return outbox::standby::parse(setting, required, error) && !required.none();
    } catch (...) {
        return true;  // out of memory: the check below says so
    }
}

bool hold_cpp(const char *setting, const SyncNames &sync, const Position *pos, int n, uint64 target,
              const char *verb, char *why, std::size_t len) noexcept {
    try {
        outbox::standby::Required required;
        std::string text;
        if (!outbox::standby::parse(setting, required, text)) {
            strlcpy(why, ("outbox.wait_for_standbys: " + text).c_str(), len);
            return false;
        }
        if (required.sync) {
            required.rule.quorum = sync.quorum;
            required.rule.num_sync = sync.num_sync;
            const char *member = sync.members;
            for (int i = 0; i < sync.nmembers; i++) {
                required.rule.members.emplace_back(member);
                member += strlen(member) + 1;
            }
        }
        std::vector<outbox::standby::Standby> standbys;
        standbys.reserve(static_cast<std::size_t>(n));
        for (int i = 0; i < n; i++) standbys.push_back({pos[i].name, pos[i].lsn});
        if (outbox::standby::hold(required, standbys, target, verb, text)) return true;
        strlcpy(why, text.c_str(), len);
        return false;
    } catch (...) {
        strlcpy(why, "out of memory", len);
        return false;
    }
}

// ---- Postgres side ----

const char *setting() { return outbox_wait_for_standbys ? outbox_wait_for_standbys : ""; }

// Rereads every walsender's name from the backend status table.
void learn_senders() {
    if (!known)
        known = static_cast<KnownSender *>(
            MemoryContextAllocZero(TopMemoryContext, sizeof(KnownSender) * Max(max_wal_senders, 1)));
    known_n = 0;
    pgstat_clear_backend_activity_snapshot();
    int n = pgstat_fetch_stat_numbackends();
    for (int i = 1; i <= n && known_n < max_wal_senders; i++) {
        LocalPgBackendStatus *local = outbox::pg::local_backend_status(i);
        if (!local || local->backendStatus.st_backendType != B_WAL_SENDER) continue;
        const PgBackendStatus &b = local->backendStatus;
        KnownSender &k = known[known_n++];
        k.pid = b.st_procpid;
        k.physical = b.st_databaseid == InvalidOid;
        strlcpy(k.name, b.st_appname ? b.st_appname : "", sizeof k.name);
    }
    pgstat_clear_backend_activity_snapshot();
}

const KnownSender *find_sender(pid_t pid) {
    for (int i = 0; i < known_n; i++)
        if (known[i].pid == pid) return &known[i];
    return nullptr;
}

// The positions of the physical standbys streaming from this server.
int read_positions() {
    if (!positions)
        positions = static_cast<Position *>(
            MemoryContextAllocZero(TopMemoryContext, sizeof(Position) * Max(max_wal_senders, 1)));
    int n = 0;
    bool learned = false;
    for (int i = 0; WalSndCtl && i < max_wal_senders; i++) {
        WalSnd *ws = &WalSndCtl->walsnds[i];
        SpinLockAcquire(&ws->mutex);
        pid_t pid = ws->pid;
        WalSndState st = ws->state;
        XLogRecPtr lsn = outbox_standby_lsn == OUTBOX_STANDBY_LSN_WRITE   ? ws->write
                         : outbox_standby_lsn == OUTBOX_STANDBY_LSN_REPLAY ? ws->apply
                                                                          : ws->flush;
        SpinLockRelease(&ws->mutex);
        if (pid == 0 || st == WALSNDSTATE_STARTUP || st == WALSNDSTATE_BACKUP) continue;
        const KnownSender *k = find_sender(pid);
        if (!k && !learned) {
            learn_senders();
            learned = true;
            k = find_sender(pid);
        }
        if (!k || !k->physical) continue;
        strlcpy(positions[n].name, k->name, NAMEDATALEN);
        positions[n].lsn = lsn;
        n++;
    }
    return n;
}

}  // namespace

bool outbox_standbys_required(void) { return required_cpp(setting()); }

XLogRecPtr outbox_batch_wal_end(void) {
    XLogRecPtr end = XactLastRecEnd != InvalidXLogRecPtr ? XactLastRecEnd : GetXLogInsertRecPtr();
    XLogFlush(end);
    return end;
}

bool outbox_standbys_hold(XLogRecPtr target, char *why, std::size_t len) {
    if (!required_cpp(setting())) return true;
    int n = read_positions();
    const char *verb = outbox_standby_lsn == OUTBOX_STANDBY_LSN_WRITE    ? "written"
                       : outbox_standby_lsn == OUTBOX_STANDBY_LSN_REPLAY ? "replayed"
                                                                         : "flushed";
    SyncNames sync;
    if (const SyncRepConfigData *c = SyncRepConfig) {
        sync.quorum = c->syncrep_method == SYNC_REP_QUORUM;
        sync.num_sync = c->num_sync;
        sync.nmembers = c->nmembers;
        sync.members = c->member_names;
    }
    return hold_cpp(setting(), sync, positions, n, target, verb, why, len);
}
