// Which hung rank is the cause and which are its victims. When one rank stops (a deadlock, a
// stuck read), the others block in their next collective soon after and stop heartbeating too,
// so a heartbeat alone cannot tell them apart; their stacks can. A rank whose main thread waits
// inside a collective (torch.distributed, DDP's reducer, gloo, NCCL, the store) is a victim; a
// rank stuck anywhere else is the root cause.
//
// Pure: parses the text of a faulthandler dump (Python) and of eu-stack or gdb (native).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace dlaunch {

struct PyFrame {
  std::string file;
  int line = 0;
  std::string function;
};
struct PyThreadStack {
  bool current = false;         // the thread that handled the signal
  std::vector<PyFrame> frames;  // innermost first, as faulthandler prints them
};

// The threads of every dump in `text` (faulthandler.dump_traceback(all_threads=True) format).
// faulthandler lists the newest thread first, so the main thread is the last one of a dump.
// Text that is not a dump gives no threads.
std::vector<PyThreadStack> parse_faulthandler_dump(const std::string& text);

// The frames of thread `tid` in eu-stack's ("TID 123:") or gdb's ("(LWP 123)") output, one
// string per frame, innermost first; empty when the thread is not in it.
std::vector<std::string> native_thread_frames(const std::string& text, int tid);

struct HangFinding {
  bool stopped = false;        // the process is stopped (SIGSTOP, Ctrl-Z, a debugger): stuck
                               // whatever its stack shows
  bool in_collective = false;  // waiting for peers: a victim
  bool have_python = false;    // a Python stack was read
  bool have_native = false;    // a native stack of the main thread was read
  // Where the main thread is: "stuck_forever (train.py:42)" or "all_reduce (.../
  // distributed_c10d.py:1536)", or a native frame when no Python stack was read.
  std::string where;
  // The main thread's Python frames, innermost first, for the report: "  File ..., line N in f".
  std::string python_stack;
};

// `py_dump`: what the worker wrote after the request (may be empty); `native`: the stack
// tool's output for `pid` (may be empty).
HangFinding diagnose_hang(const std::string& py_dump, const std::string& native, int pid);

// The index of the root cause among `findings` (one per hung worker, in local rank order): the
// first stopped one, else the first whose stacks show it outside a collective, else the first
// without stacks, else the first. nullopt for an empty list.
std::optional<size_t> pick_hang_root(const std::vector<HangFinding>& findings);

}  // namespace dlaunch
