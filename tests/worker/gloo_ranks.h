// Runs `fn` on `world` ranks, each a thread with its own gloo process group over one in-memory
// store, and rethrows the first rank's failure after all have joined. For the worker tests that
// need real collectives without starting processes.
#pragma once

#include <gloo/rendezvous/hash_store.h>

#include <chrono>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "worker/comm/process_group_gloo.h"

namespace dlaunch::test {

inline void run_gloo_ranks(int world, const std::function<void(comm::ProcessGroup&)>& fn,
                           std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  gloo::rendezvous::HashStore store;
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        comm::GlooOptions opts;
        opts.timeout = timeout;
        auto pg = comm::make_gloo_process_group(store, r, world, opts);
        fn(*pg);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace dlaunch::test
