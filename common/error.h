// Errors: one exception root for what callers can handle, and DL_CHECK for invariants.
//
// Recoverable failures throw a subclass of dlaunch::Error; catch the subclass you can act on
// (a TimeoutError means "try again or give up", a ClosedError "the peer went away"). Broken
// invariants (a bug in dlaunch, not bad input) use DL_CHECK, which throws InternalError with
// the file, line, condition and any values streamed into it:
//
//   DL_CHECK(offset + n <= size_) << "offset=" << offset << " n=" << n << " size=" << size_;
//
// Every message a user may read says what was expected, what was found and what to do.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace dlaunch {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A deadline passed (store get/wait, rendezvous join, connect).
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// Could not reach a peer (refused, unreachable, name did not resolve).
class ConnectionError : public Error {
 public:
  using Error::Error;
};

// The peer or the object was closed while we used it.
class ClosedError : public Error {
 public:
  using Error::Error;
};

// The bytes on the wire did not follow the protocol (bad opcode, oversized frame, bad magic).
class ProtocolError : public Error {
 public:
  using Error::Error;
};

// The request is valid but the current state forbids it (node rank taken, round closed).
class StateError : public Error {
 public:
  using Error::Error;
};

// The user asked for something invalid (bad flag, value or combination). dlaunch exits 2.
class UsageError : public Error {
 public:
  using Error::Error;
};

// A file or system call failed (open, read, fork, bind); carries errno's text in the message.
class SystemError : public Error {
 public:
  using Error::Error;
};

// A DL_CHECK failed: a bug in dlaunch.
class InternalError : public Error {
 public:
  using Error::Error;
};

// Builds "<what>: <strerror(errno)>" for SystemError messages.
std::string errno_message(const std::string& what, int err);

namespace detail {

// Collects the streamed values of a failed DL_CHECK and throws from its destructor, which is
// why the destructor is noexcept(false). It exists only on the failure path.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  CheckFailure(const CheckFailure&) = delete;
  CheckFailure& operator=(const CheckFailure&) = delete;
  [[noreturn]] ~CheckFailure() noexcept(false);

  template <typename T>
  CheckFailure& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  std::ostringstream stream_;
};

}  // namespace detail
}  // namespace dlaunch

#define DL_CHECK(cond) \
  if (cond) {          \
  } else               \
    ::dlaunch::detail::CheckFailure(__FILE__, __LINE__, #cond)
