// Running the extension's own SQL: every statement is a saved SPI plan,
// prepared the first time a process runs it and kept for the process.
// Postgres-side; callers are inside a transaction with SPI connected, and
// every function here may ereport(ERROR).
#pragma once

#include "outbox/pg.h"

extern "C" {
#include "executor/spi.h"
}

inline constexpr int kOutboxQueryMaxArgs = 12;

// One statement: its text, argument types, the SPI result it must give,
// and what it does (for the error message when it does not).
struct OutboxQuery {
    const char *what;  // "claiming pending messages"
    const char *sql;
    int nargs;
    Oid argtypes[kOutboxQueryMaxArgs];
    int expected;      // SPI_OK_SELECT, SPI_OK_UPDATE, ...
    SPIPlanPtr plan;   // nullptr until first used
};

// Executes q (preparing it first if needed) with `values` (and `nulls` in
// SPI's ' '/'n' form, or nullptr for none); `limit` rows at most (0: all).
// Returns SPI_processed; the rows are in SPI_tuptable.  ERROR naming
// q->what when the result is not q->expected.
uint64 outbox_run(OutboxQuery *q, const Datum *values, const char *nulls, long limit);

// The same statement as a cursor, for a caller that reads its rows a few
// at a time (SPI_cursor_fetch) and stops early; close it with
// SPI_cursor_close.
Portal outbox_open_cursor(OutboxQuery *q, const Datum *values, const char *nulls);

// Column `column` (1-based) of row `row` of the last result.
Datum outbox_col(uint64 row, int column, bool *isnull);
// The same, as a palloc'd C string (nullptr for NULL).
char *outbox_col_text(uint64 row, int column);

// A text[] datum of n strings (lengths given; no NUL needed), and the same
// with NULL elements for nullptr entries (NUL-terminated strings).
Datum outbox_text_array(const char *const *values, const std::size_t *lengths, int n);
Datum outbox_text_array_nullable(const char *const *values, int n);
Datum outbox_int8_array(const int64 *values, int n);
// A one-dimensional array of `type` (NULL elements where nulls[i]).
Datum outbox_array(const Datum *elems, const bool *nulls, int n, Oid type);
