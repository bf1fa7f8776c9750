#include "launcher/agent/failure_report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace dlaunch {
namespace {

constexpr size_t kMaxRaw = 4096;

std::string indent(const std::string& text, const std::string& pad) {
  std::string out;
  std::istringstream in(text);
  std::string line;
  bool first = true;
  while (std::getline(in, line)) {
    out += (first ? "" : "\n" + pad) + line;
    first = false;
  }
  return out;
}

std::string json_text(const nlohmann::json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_null()) return "";
  return j.dump();
}

// A root cause is a worker's own end while the group was healthy; dlaunch sends SIGKILL only
// when stopping a group that already failed, so a root cause killed by SIGKILL was killed by
// someone else, most often the kernel's OOM killer (a cgroup or Slurm --mem limit, or the node
// out of memory). dmesg is not readable by every user, so this is a hint, not a diagnosis.
// Exit code 137 is the same seen through a shell or wrapper whose child was SIGKILLed.
std::string sigkill_hint(const ExitStatus& e) {
  bool sigkill = e.signaled && e.code == SIGKILL;
  bool via_shell = !e.signaled && e.code == 128 + SIGKILL;
  if (!sigkill && !via_shell) return "";
  static const char* const kSigkill[] = {
      "SIGKILL, which dlaunch did not send, usually means the kernel's OOM",
      "killer: the node ran out of memory, or the job hit its memory limit",
      "(cgroup, Slurm --mem). Look for \"Killed process\" in `dmesg` or",
      "`journalctl -k` (may need root); lower the memory use (batch size,",
      "DataLoader workers) or ask for more memory."};
  static const char* const kViaShell[] = {
      "exit code 137 is 128 + SIGKILL: a process under the worker was",
      "SIGKILLed, usually by the kernel's OOM killer: the node ran out of",
      "memory, or the job hit its memory limit (cgroup, Slurm --mem). Look for",
      "\"Killed process\" in `dmesg` or `journalctl -k` (may need root); lower",
      "the memory use (batch size, DataLoader workers) or ask for more memory."};
  std::string out;
  for (const char* line : sigkill ? kSigkill : kViaShell) {
    out += (out.empty() ? "  hint      : " : "              ") + std::string(line) + "\n";
  }
  return out;
}

}  // namespace

std::optional<ErrorFileContents> read_error_file(const std::string& path) {
  if (path.empty()) return std::nullopt;
  std::ifstream f(path);
  if (!f) return std::nullopt;
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (text.empty()) return std::nullopt;
  ErrorFileContents out;
  try {
    auto j = nlohmann::json::parse(text);
    const auto& m = j.at("message");
    if (m.is_object()) {
      out.message = json_text(m.value("message", nlohmann::json()));
      if (m.contains("extraInfo") && m["extraInfo"].is_object()) {
        const auto& extra = m["extraInfo"];
        out.traceback = json_text(extra.value("py_callstack", nlohmann::json()));
        out.timestamp = json_text(extra.value("timestamp", nlohmann::json()));
      }
    } else {
      out.message = json_text(m);
      if (j.contains("timestamp")) out.timestamp = json_text(j["timestamp"]);
    }
  } catch (const std::exception&) {
    out.raw = text.size() > kMaxRaw ? text.substr(0, kMaxRaw) + "\n... (cut)" : text;
  }
  return out;
}

std::string format_wall_time(std::chrono::system_clock::time_point t) {
  std::time_t seconds = std::chrono::system_clock::to_time_t(t);
  int millis = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count() % 1000);
  std::tm tm{};
  localtime_r(&seconds, &tm);
  return fmt::format("{:04}-{:02}-{:02}_{:02}:{:02}:{:02}.{:03}", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, millis);
}

std::string hang_silence(const WorkerRecord& w, Duration hang_timeout) {
  if (w.hang_rule.empty()) {
    return fmt::format("more than {:.1f} s (--hang_timeout)", to_seconds(hang_timeout));
  }
  return fmt::format("{:.1f} s, more than {:.1f} s ({})", to_seconds(w.hang_silence),
                     to_seconds(w.hang_timeout), w.hang_rule);
}

std::string describe_end(const WorkerRecord& w, Duration hang_timeout) {
  std::string what;
  if (w.hung) {
    what = "hung: no heartbeat for " + hang_silence(w, hang_timeout);
    if (!w.hang_where.empty()) what += ", in " + w.hang_where;
    if (w.exit) what += fmt::format(", then ended by {}", w.exit->describe());
  } else if (w.abandoned) {
    what = "did not exit after SIGKILL (abandoned)";
  } else if (w.exit) {
    what = w.exit->describe();
  } else if (w.state == WorkerState::kInit) {
    what = "never started";
  } else {
    what = "still running";
  }
  return fmt::format("rank {} (local_rank {}, pid {}): {}", w.global_rank, w.local_rank, w.pid,
                     what);
}

// The root cause when it is a rank stuck on another node (its agent's verdict).
std::string format_remote_root_cause(const NodeHangVerdict& r, const ReportContext& ctx) {
  std::string out = "Root cause (a rank stuck on another node; the ranks here waited for it):\n";
  out += fmt::format("  host      : {} (node rank {})\n", r.host, r.node_rank);
  out += fmt::format("  rank      : {} (local_rank: {})\n", r.rank, r.local_rank);
  if (ctx.hang_timeout_auto) {
    out += fmt::format("  hung      : no heartbeat past --hang_timeout auto; its node's report "
                       "says for how long (pid: {})\n",
                       r.pid);
  } else {
    out += fmt::format("  hung      : no heartbeat for more than {:.1f} s (pid: {})\n",
                       to_seconds(ctx.hang_timeout), r.pid);
  }
  if (!r.stacks_dir.empty()) {
    out += fmt::format("  stacks    : {}/stack.txt (on {})\n", r.stacks_dir, r.host);
  }
  if (!r.where.empty()) out += fmt::format("  stuck in  : {}\n", r.where);
  if (!r.python_stack.empty()) {
    out += "  python    : (main thread, most recent call first)\n";
    out += "  " + indent(r.python_stack, "  ") + "\n";
  }
  return out;
}

// What the failed worker left to read: its error file's message, else the tail of its stderr.
std::string format_worker_output(const WorkerRecord& w) {
  auto ef = read_error_file(w.error_file);
  std::string out = fmt::format("  error_file: {}\n", ef ? w.error_file : "<N/A>");
  if (ef) {
    std::string msg = !ef->traceback.empty() ? ef->traceback
                      : !ef->message.empty()  ? ef->message
                                              : ef->raw;
    if (!ef->traceback.empty() && !ef->message.empty()) msg = ef->message + "\n" + ef->traceback;
    out += fmt::format("  traceback : {}\n", indent(msg, "    "));
  } else if (!w.stderr_tail.empty()) {
    out += fmt::format("  stderr    : (last {} lines)\n", w.stderr_tail.size());
    for (const auto& line : w.stderr_tail) out += "    " + line + "\n";
  } else {
    out += "  stderr    : <empty>\n";
  }
  return out;
}

// The root cause when it is a worker of this node: how it ended, and what it left to read.
std::string format_local_root_cause(const WorkerRecord& w, const ReportContext& ctx) {
  std::string out = "Root cause (first observed failure):\n";
  out += fmt::format("  time      : {}\n", format_wall_time(w.exited_wall));
  std::vector<std::string> which;
  if (ctx.node_rank >= 0) which.push_back(fmt::format("node rank {}", ctx.node_rank));
  if (!ctx.local_addr.empty() && ctx.local_addr != ctx.host) which.push_back(ctx.local_addr);
  out += fmt::format("  host      : {}{}\n", ctx.host,
                     which.empty() ? "" : fmt::format(" ({})", fmt::join(which, ", ")));
  out += fmt::format("  rank      : {} (local_rank: {})\n", w.global_rank, w.local_rank);
  if (w.hung) {
    if (w.hang_rule.empty()) {
      out += fmt::format("  hung      : no heartbeat for more than {:.1f} s (pid: {})\n",
                         to_seconds(ctx.hang_timeout), w.pid);
    } else {
      out += fmt::format("  hung      : no heartbeat for {} (pid: {})\n",
                         hang_silence(w, ctx.hang_timeout), w.pid);
    }
    std::string stack = w.log_dir + "/stack.txt";
    out += fmt::format("  stacks    : {}\n", stack);
    if (!w.hang_where.empty()) out += fmt::format("  stuck in  : {}\n", w.hang_where);
    if (!w.python_stack.empty()) {
      out += fmt::format("  py_stacks : {}/py_stack.txt\n", w.log_dir);
      out += "  python    : (main thread, most recent call first)\n";
      out += "  " + indent(w.python_stack, "  ") + "\n";
    }
  } else if (w.exit) {
    if (w.exit->signaled) {
      out += fmt::format("  exitcode  : -{} ({}{}) (pid: {})\n", w.exit->code,
                         signal_name(w.exit->code), w.exit->core_dumped ? ", core dumped" : "",
                         w.pid);
    } else {
      out += fmt::format("  exitcode  : {} (pid: {})\n", w.exit->code, w.pid);
    }
    out += sigkill_hint(*w.exit);
  }
  return out + format_worker_output(w);
}

std::string format_failure_report(const WorkerGroup& group, const ReportContext& ctx) {
  const std::string bar(64, '=');
  const std::string rule(64, '-');
  std::string out = "\n" + bar + "\n";
  out += fmt::format("dlaunch: job FAILED after {} restart(s) of {} allowed (attempt {})\n",
                     ctx.restarts_used, ctx.max_restarts, group.attempt());
  if (!ctx.version.empty()) out += fmt::format("version: {}\n", ctx.version);
  out += rule + "\n";
  auto root = group.root_cause();
  if (ctx.stuck_elsewhere) {
    out += format_remote_root_cause(*ctx.stuck_elsewhere, ctx);
  } else if (!root) {
    out += fmt::format("Root cause: {}\n", group.stop_reason().empty() ? "unknown" : group.stop_reason());
  } else {
    out += format_local_root_cause(group.workers()[static_cast<size_t>(*root)], ctx);
  }
  out += rule + "\n";
  out += ctx.stuck_elsewhere
             ? "Workers on this node (its victims: they waited in a collective):\n"
             : "Other workers (consequences of the first failure):\n";
  bool any = false;
  for (const auto& w : group.workers()) {
    if (root && w.local_rank == *root && !ctx.stuck_elsewhere) continue;
    out += "  " + describe_end(w, ctx.hang_timeout) + "\n";
    any = true;
  }
  if (!any) out += "  <none>\n";
  if (!ctx.earlier.empty()) {
    out += rule + "\n";
    out += "Earlier attempts:\n";
    for (const auto& e : ctx.earlier) out += "  " + e + "\n";
  }
  if (!ctx.stuck.empty()) {
    out += rule + "\n";
    out += "Processes that would not die (not waited for):\n";
    for (const auto& s : ctx.stuck) out += "  " + s + "\n";
  }
  if (!ctx.events_file.empty()) {
    out += rule + "\n";
    out += "Timeline of this node: " + ctx.events_file + "\n";
    out += "  (every node's, merged: dlaunch status --events with the job's endpoint and run id)\n";
  }
  out += bar + "\n";
  return out;
}

}  // namespace dlaunch
