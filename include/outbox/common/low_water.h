// The relay's low-water mark, its pure part: the arithmetic of the mark and
// of a writer's announcement.  What the mark is, what may pass it and why no
// committed row is left below it: docs/architecture.md, "The low-water
// mark".  The Postgres side (shared memory, the turn's steps, the straggler
// scan) is outbox/low_water.h.
#pragma once

#include <cstdint>
#include <limits>

namespace outbox::low_water {

// "No rescan asked": lowering a mark to it changes nothing.
inline constexpr int64_t kNone = std::numeric_limits<int64_t>::max();

// A relay's mark: every row below it is published, parked or waiting for a
// retry.
class Mark {
  public:
    int64_t value() const noexcept { return value_; }

    // Something below the mark may be claimable again (a rescan point, a
    // retry due, a row parked): the next claim starts at `id` or below.
    void lower_to(int64_t id) noexcept;

    // The end of a turn: `first_pending` is the first row a claim may take
    // (-1: none), found by a statement whose snapshot was taken after the
    // id sequence was read; `next_id` is that sequence's next id.  The
    // mark never passes an id assigned after the read.
    void advance(int64_t first_pending, int64_t next_id) noexcept;

  private:
    int64_t value_ = 0;
};

// A writing backend's announcement: the lowest id its transaction
// inserted, handed over once at the transaction's end.
class Announcement {
  public:
    void wrote(int64_t id) noexcept;
    // The lowest id written since the last take (-1: none), and forgets it.
    int64_t take() noexcept;

  private:
    int64_t lowest_ = -1;
};

// How long the straggler scan waits before it runs again: at least
// `poll_interval_ms`, and long enough that a scan that took `took_ms`
// spends at most 1/cost_share of the time scanning.
long next_scan_in_ms(long poll_interval_ms, long took_ms, long cost_share) noexcept;

}  // namespace outbox::low_water
