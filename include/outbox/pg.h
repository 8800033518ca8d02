// The one place that includes Postgres headers into C++.  Include it after
// any C++ standard headers: Postgres defines macros (printf, snprintf, Max,
// gettext...) that would break them.
#pragma once

#ifdef OUTBOX_PURE_TU
#error "outbox/pg.h is for Postgres-side files; this translation unit is pure C++"
#endif

// The library is built with -fvisibility=hidden: only what Postgres looks
// up by name (PG_FUNCTION_INFO_V1 functions, _PG_init, the worker entry
// point, the magic block) is exported.  PostgreSQL 15 leaves PGDLLEXPORT
// empty on Linux; 16+ define it like this.
#ifndef PGDLLEXPORT
#define PGDLLEXPORT __attribute__((visibility("default")))
#endif

extern "C" {
#include "postgres.h"
#include "fmgr.h"
#include "miscadmin.h"
}

// PGPROC latch pointers are used from other processes; all Postgres
// versions we build on (15..17) keep them in shared memory.
#if PG_VERSION_NUM < 150000
#error "pg outbox needs PostgreSQL 15 or newer"
#endif
