#include "rendezvous/tcp/wait_notes.h"

#include <fmt/format.h>

namespace dlaunch {

bool WaitNotes::due(TimePoint now) {
  if (now - start_ < next_) return false;
  // A step that blocked past several due times (a DNS lookup waiting out its resolver's
  // timeout) still makes one note, not one per missed time.
  while (next_ <= now - start_) next_ *= 2;
  return true;
}

std::string WaitNotes::how_long(TimePoint now, Duration join_timeout) const {
  return fmt::format("for {:.0f} s of the {:g} s join timeout", to_seconds(now - start_),
                     to_seconds(join_timeout));
}

}  // namespace dlaunch
