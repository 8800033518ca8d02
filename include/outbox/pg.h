// The one place that includes Postgres headers into C++.  Include it after
// any C++ standard headers: Postgres defines macros (printf, snprintf, Max,
// gettext...) that would break them.  Version differences live in
// outbox/pg_compat.h, which this includes first.
#pragma once

#ifdef OUTBOX_PURE_TU
#error "outbox/pg.h is for Postgres-side files; this translation unit is pure C++"
#endif

#include "outbox/pg_compat.h"

extern "C" {
#include "fmgr.h"
#include "miscadmin.h"
}
