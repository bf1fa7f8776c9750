// What lets the etcd client (rendezvous/etcd/etcd_client.cc) run on FiberLoop fibers unchanged,
// as fiber_socket_hooks.cc does for the TCP store client. The etcd client does not block in
// send/recv/poll: each of its connections has an Asio io_context of its own, whose socket calls
// are non-blocking recvmsg/sendmsg and whose one blocking call is epoll_wait on that context's
// epoll descriptor (its sockets, its timerfd for deadlines, its eventfd for wake-ups). So:
//   - epoll_wait, called on a fiber, yields to the loop until that epoll descriptor is readable
//     (an epoll descriptor can itself be watched by epoll) or its timeout passes; off a fiber it
//     is libc's (the loop's own epoll_wait, the store server threads, the thread driver);
//   - Asio's thread-local call stack (which io_context runs on this thread, and the handler
//     memory cache it points to) follows the fiber (FiberLoop::add_fiber_local): with two fibers
//     inside two io_contexts' run() on one thread, the thread-wide record would otherwise be
//     left pointing into a finished frame.
// As fiber_socket_hooks.cc, this definition of epoll_wait takes the place of libc's in this
// executable only (ELF symbol interposition; Asio is header-only, so its calls are ours).
#include <sys/epoll.h>

#include <boost/asio/detail/call_stack.hpp>
#include <boost/asio/detail/thread_context.hpp>
#include <boost/asio/detail/thread_info_base.hpp>
#include <boost/asio/detail/tss_ptr.hpp>

#include "bench/rendezvous/fiber_loop.h"

// Every tss_ptr<T> of one T shares one thread-local (a static member) only with the thread
// keyword; with pthread keys each would be its own, and the swap below would do nothing.
#if !defined(BOOST_ASIO_HAS_THREAD_KEYWORD_EXTENSION)
#error "fiber_asio_hooks.cc needs Asio's __thread call stack (BOOST_ASIO_HAS_THREAD_KEYWORD_EXTENSION)"
#endif

using dlaunch::sim::FiberLoop;

namespace {

namespace asio_detail = boost::asio::detail;
using AsioCallStack =
    asio_detail::call_stack<asio_detail::thread_context, asio_detail::thread_info_base>;

// A view of Asio's thread-local top of the call stack (the same variable as Asio's own).
asio_detail::tss_ptr<AsioCallStack::context>& asio_top() {
  static asio_detail::tss_ptr<AsioCallStack::context> top;
  return top;
}

[[maybe_unused]] const bool kRegistered = [] {
  FiberLoop::add_fiber_local(
      {[]() -> void* { return static_cast<AsioCallStack::context*>(asio_top()); },
       [](void* v) { asio_top() = static_cast<AsioCallStack::context*>(v); }});
  return true;
}();

}  // namespace

extern "C" int epoll_wait(int epfd, struct epoll_event* events, int maxevents, int timeout) {
  FiberLoop* loop = FiberLoop::current();
  if (loop == nullptr || timeout == 0) {
    return epoll_pwait(epfd, events, maxevents, timeout, nullptr);
  }
  return loop->wait_until(epfd, EPOLLIN, timeout,
                          [&] { return epoll_pwait(epfd, events, maxevents, 0, nullptr); });
}
