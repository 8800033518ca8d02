// Wake-up on commit: outbox.write() notes that this transaction wrote a
// message; the commit callback wakes the relay once the rows are visible.
#pragma once

#include "outbox/pg.h"

// Registers the transaction callback (once per process, from _PG_init).
void outbox_wakeup_init(void);

// Called by outbox.write*(): the current transaction holds a new message.
void outbox_wakeup_note_write(void);

// The current transaction made older rows pending again (retry, replay):
// at commit the relays look at the whole table again, and wake.
void outbox_wakeup_note_rescan(void);

// The current transaction stored inbox records (or changed subscriptions):
// wake the inbox handlers at commit.
void outbox_wakeup_note_inbox(void);
