// "Log once per distinct error": what a worker said last, so a condition that
// persists across turns fills the log with one line, not one a turn.
#pragma once

#include <cstddef>

namespace outbox {

class SaidOnce {
  public:
    // True when `text` differs from what was said last, and remembers it:
    // the caller says it now.  A text longer than the capacity is
    // remembered cut short, so it compares by its beginning.
    bool first_time(const char *text) noexcept;

    // The condition is over: the next text is said again, even the same one.
    void forget() noexcept { said_[0] = '\0'; }

    bool said_something() const noexcept { return said_[0] != '\0'; }

    static constexpr std::size_t kCapacity = 512;

  private:
    void remember(const char *text) noexcept;

    char said_[kCapacity] = "";
};

}  // namespace outbox
