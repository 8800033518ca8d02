// Text between UTF-8 (Kafka's side: JSON, keys and header values) and the
// database's encoding: the one place that converts it.  Postgres-side,
// C-style: each function allocates in the current memory context, and none
// ERRORs for a character one side lacks (it says so by returning nullptr,
// or escapes it), so that a record or a row is parked or kept, never
// retried forever.
#pragma once

#include <cstddef>

#include "outbox/pg.h"

// `len` bytes of UTF-8 as a NUL-terminated string in the database's
// encoding (a copy), or nullptr when they are not valid UTF-8, hold a NUL,
// or hold a character the encoding lacks.
char *outbox_encoding_from_utf8(const char *utf8, std::size_t len);

// `len` bytes of UTF-8 as text in the database's encoding, always: what
// cannot be kept as a character (bytes that are not UTF-8, a character the
// encoding lacks) is written as \xNN escapes of its bytes.
char *outbox_encoding_from_utf8_escaped(const char *utf8, std::size_t len);

// `*len` bytes of text in the database's encoding as UTF-8, with `*len`
// set to the result's length; `s` itself when nothing needs converting (a
// UTF-8 database; SQL_ASCII, which has no encoding to convert from, sends
// its bytes as they are).  nullptr when a character has no equivalent in
// UTF-8 (a few bytes of WIN1251 or WIN1252 map to nothing).  For workers:
// the conversion is looked up once per process, since their database and
// their search_path never change.
const char *outbox_encoding_to_utf8(const char *s, std::size_t *len);
