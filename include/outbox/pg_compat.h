// Every difference between the PostgreSQL versions pg outbox builds against,
// in one place (as pg_net's pg_prelude.h): no other file tests
// PG_VERSION_NUM.  15, 17, 18 and 19 (19~rc1, Debian experimental) are
// built and tested (README, Install);
// 16 is built on paper only (no Debian suite packages it): its branches
// follow the 15 and 17 APIs it sits between.  Included by outbox/pg.h only.
// The Makefile preprocesses this header alone before it compiles anything,
// so an unsupported server stops the build with the one #error line below.
#pragma once

// The library is built with -fvisibility=hidden: only what Postgres looks
// up by name (PG_FUNCTION_INFO_V1 functions, _PG_init, the worker entry
// point, the magic block) is exported.  PostgreSQL 15 leaves PGDLLEXPORT
// empty on Linux; 16+ define it like this.
#ifndef PGDLLEXPORT
#define PGDLLEXPORT __attribute__((visibility("default")))
#endif

extern "C" {
#include "postgres.h"
}

#if PG_VERSION_NUM < 150000 || PG_VERSION_NUM >= 200000
#error "pg outbox builds against PostgreSQL 15, 16, 17, 18 and 19 only; pg_config names another version"
#else

extern "C" {
#include "miscadmin.h"
#include "access/relation.h"
#include "catalog/dependency.h"
#include "catalog/pg_proc.h"
#if PG_VERSION_NUM >= 190000
// get_database_name(): 19 moved it (and get_database_oid()) from
// commands/dbcommands.h to utils/lsyscache.h.
#include "utils/lsyscache.h"
#else
#include "commands/dbcommands.h"
#endif
#include "storage/latch.h"
#include "storage/proc.h"
#include "utils/acl.h"
#include "utils/backend_status.h"
#include "utils/memutils.h"
#if PG_VERSION_NUM >= 160000
// 16 moved the varlena macros (VARSIZE_ANY_EXHDR, VARDATA_ANY...) out of
// postgres.h.
#include "varatt.h"
#endif
}

namespace outbox::pg {

// May `role` execute function `fn`?  16 replaced pg_proc_aclcheck() with
// the catalog-generic object_aclcheck().
inline bool may_execute_function(Oid fn, Oid role) {
#if PG_VERSION_NUM >= 160000
    return object_aclcheck(ProcedureRelationId, fn, role, ACL_EXECUTE) == ACLCHECK_OK;
#else
    return pg_proc_aclcheck(fn, role, ACL_EXECUTE) == ACLCHECK_OK;
#endif
}

// A wait event set for the life of the process, owned by no resource owner.
// 17 takes a resource owner (none here) where 15 and 16 took a memory
// context; both allocate it in TopMemoryContext.
inline WaitEventSet *create_process_wait_set(int nevents) {
#if PG_VERSION_NUM >= 170000
    return CreateWaitEventSet(nullptr, nevents);
#else
    return CreateWaitEventSet(TopMemoryContext, nevents);
#endif
}

// The sequence behind column `attnum` of table `relid` if it is an identity
// column, else InvalidOid (also when the table is gone).  17 takes the open
// relation (for partitions) where 15 and 16 took its oid; the lock taken to
// open it is held to the end of the transaction, as Postgres does.
inline Oid identity_sequence(Oid relid, AttrNumber attnum) {
#if PG_VERSION_NUM >= 170000
    Relation rel = try_relation_open(relid, AccessShareLock);
    if (rel == nullptr) return InvalidOid;
    Oid seq = getIdentitySequence(rel, attnum, true);
    relation_close(rel, NoLock);
    return seq;
#else
    return getIdentitySequence(relid, attnum, true);
#endif
}

// Entry `index` (1-based) of this process's copy of the backend status
// table, or nullptr.  16 split the look-up by index from the one by backend
// id; 15's pgstat_fetch_stat_local_beentry() takes the index.
inline LocalPgBackendStatus *local_backend_status(int index) {
#if PG_VERSION_NUM >= 160000
    return pgstat_get_local_beentry_by_index(index);
#else
    return pgstat_fetch_stat_local_beentry(index);
#endif
}

// Settings a worker pins (worker_common.cpp) that only some versions have:
// 17 added transaction_timeout, which a database owner could otherwise set
// to end every worker transaction.
inline constexpr const char *kVersionPinned[][2] = {
#if PG_VERSION_NUM >= 170000
    {"transaction_timeout", "0"},
#endif
    {nullptr, nullptr},
};

}  // namespace outbox::pg

#endif
