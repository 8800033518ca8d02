// Marks a translation unit as pure C++: it must never include Postgres
// headers.  outbox/pg.h refuses to compile when this is defined, so a pure
// file that reaches postgres.h (directly or through another header) fails
// at build time instead of mixing longjmp and exceptions at run time.
#pragma once
#define OUTBOX_PURE_TU 1
#ifdef POSTGRES_H
#error "a pure C++ translation unit included postgres.h"
#endif
