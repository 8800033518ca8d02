#include "outbox/pure_tu.h"
#include "outbox/common/said_once.h"

#include <cstring>

namespace outbox {

bool SaidOnce::first_time(const char *text) noexcept {
    if (std::strncmp(text, said_, kCapacity - 1) == 0) return false;
    remember(text);
    return true;
}

void SaidOnce::remember(const char *text) noexcept {
    std::size_t n = std::strlen(text);
    if (n > kCapacity - 1) n = kCapacity - 1;
    std::memcpy(said_, text, n);
    said_[n] = '\0';
}

}  // namespace outbox
