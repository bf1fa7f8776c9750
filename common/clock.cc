#include "common/clock.h"

namespace dlaunch {

const Clock& steady_clock() {
  static const SteadyClock clock;
  return clock;
}

}  // namespace dlaunch
