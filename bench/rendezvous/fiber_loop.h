// User-space fibers on one epoll loop, for rdzv_sim's "--driver fibers": thousands of simulated
// agents each run the real DynamicRendezvous::next_rendezvous() and the real TcpStoreClient on
// a fiber with a small stack instead of an OS thread of their own.
//
// How the real client yields without being changed: this file's .cc defines poll(), recv() and
// send() for the rdzv_sim executable (they take precedence over libc's). Called on a fiber, a
// call that would block parks the fiber in the loop's epoll set (with the socket's SO_RCVTIMEO
// or poll()'s timeout as a timer) and lets the other fibers run; called on any other thread they
// are libc's own. Only the blocking I/O the store client does is covered: a condition-variable
// wait in the state machine (its retry-after-error path) still blocks the loop for its 200 ms.
#pragma once

#include <cstdint>
#include <functional>

namespace dlaunch::sim {

// Starts `body` on a new fiber; it first runs when the loop next runs ready fibers.
void spawn_fiber(std::function<void()> body);

// Parks the calling fiber for `ns` nanoseconds (must be called on a fiber).
void fiber_sleep_ns(int64_t ns);

// Runs fibers on the calling thread until `stop()` is true after a pass (checked at least every
// 50 ms). `on_readable(fd)`: the loop also watches `fd` (-1: none) and calls it, outside any
// fiber, when it is readable.
void run_fiber_loop(int watch_fd, const std::function<void()>& on_readable,
                    const std::function<bool()>& stop);

}  // namespace dlaunch::sim
