#include "outbox/pure_tu.h"
#include "outbox/common/low_water.h"

#include <algorithm>

namespace outbox::low_water {

void Mark::lower_to(int64_t id) noexcept { value_ = std::min(value_, id); }

void Mark::advance(int64_t first_pending, int64_t next_id) noexcept {
    int64_t mark = first_pending >= 0 ? std::min(first_pending, next_id) : next_id;
    value_ = std::max<int64_t>(mark, 0);
}

void Announcement::wrote(int64_t id) noexcept {
    if (lowest_ < 0 || id < lowest_) lowest_ = id;
}

int64_t Announcement::take() noexcept {
    int64_t id = lowest_;
    lowest_ = -1;
    return id;
}

long next_scan_in_ms(long poll_interval_ms, long took_ms, long cost_share) noexcept {
    return std::max(poll_interval_ms, took_ms * cost_share);
}

}  // namespace outbox::low_water
