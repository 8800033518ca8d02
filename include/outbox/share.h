// A worker's share of the keys: worker `index` (from 0) of the `count`
// workers of its kind in the database.  A key belongs to share
// hashtext(key) mod count, so each key always goes through the same worker
// and its records stay in order.  One value, not two adjacent ints, so the
// two cannot be passed the wrong way round.
#pragma once

struct OutboxShare {
    int index;  // this worker's share, from 0 (0 for a kind with one worker)
    int count;  // workers of this kind in the database
};
