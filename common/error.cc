#include "common/error.h"

#include <cstring>

namespace dlaunch {

std::string errno_message(const std::string& what, int err) {
  return what + ": " + std::strerror(err);
}

namespace detail {

CheckFailure::CheckFailure(const char* file, int line, const char* condition) {
  stream_ << "internal error at " << file << ":" << line << ": check failed: " << condition
          << " ";
}

CheckFailure::~CheckFailure() noexcept(false) { throw InternalError(stream_.str()); }

}  // namespace detail
}  // namespace dlaunch
