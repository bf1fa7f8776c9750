#include "launcher/output/console_lines.h"

namespace dlaunch {

void ConsoleLines::emit(std::string_view more, std::string_view terminator, std::string& out) {
  // A bare '\r' at the start of a console line moves nothing on a terminal: drop it rather than
  // print an empty prefixed update.
  if (!line_open_ && pending_.empty() && more.empty() && terminator == "\r") return;
  if (style_.fold) {
    if (!line_open_ && terminator == "\n") {
      std::string text = pending_;
      text += more;
      style_.fold->line(style_.rank, text, style_.stamp ? style_.stamp() : "", now_, out);
      pending_.clear();
      return;
    }
    style_.fold->flush(out);  // what it holds came first
  }
  if (!line_open_) start_line(out);
  out += pending_;
  out += more;
  out += terminator;
  pending_.clear();
  line_open_ = false;
}

void ConsoleLines::start_line(std::string& out) {
  if (style_.stamp) out += style_.stamp();
  out += prefix_;
}

void ConsoleLines::hold(std::string_view more, TimePoint now, std::string& out) {
  if (more.empty()) return;
  if (pending_.empty() && !pending_cr_) since_ = now;
  pending_ += more;
  while (pending_.size() >= kMaxConsoleLine) {
    std::string rest = pending_.substr(kMaxConsoleLine);
    pending_.resize(kMaxConsoleLine);
    emit({}, kLineCutNote, out);
    pending_ = std::move(rest);
    since_ = now;
  }
}

void ConsoleLines::feed(std::string_view bytes, TimePoint now, std::string& out) {
  now_ = now;
  size_t i = 0;
  if (pending_cr_ && !bytes.empty()) {
    pending_cr_ = false;
    bool crlf = bytes[0] == '\n';
    emit({}, crlf ? "\r\n" : "\r", out);
    i = crlf ? 1 : 0;
  }
  while (i < bytes.size()) {
    size_t j = bytes.find_first_of("\r\n", i);
    if (j == std::string_view::npos) {
      hold(bytes.substr(i), now, out);
      return;
    }
    std::string_view text = bytes.substr(i, j - i);
    if (pending_.size() + text.size() >= kMaxConsoleLine) {  // cut it, as a tail would be
      hold(text, now, out);
      text = {};
    }
    if (bytes[j] == '\n') {
      emit(text, "\n", out);
      i = j + 1;
    } else if (j + 1 == bytes.size()) {  // '\r' last: wait for the next byte
      hold(text, now, out);
      if (pending_.empty()) since_ = now;
      pending_cr_ = true;
      return;
    } else if (bytes[j + 1] == '\n') {
      emit(text, "\r\n", out);
      i = j + 2;
    } else {
      emit(text, "\r", out);
      i = j + 1;
    }
  }
}

void ConsoleLines::flush(TimePoint now, Duration min_age, std::string& out) {
  if (pending_.empty() && !pending_cr_) return;
  if (now - since_ < min_age) return;
  now_ = now;
  if (pending_cr_) {
    pending_cr_ = false;
    emit({}, "\r", out);
    return;
  }
  if (style_.fold) style_.fold->flush(out);
  if (!line_open_) start_line(out);
  out += pending_;
  pending_.clear();
  line_open_ = true;
}

void ConsoleLines::finish(std::string& out) {
  flush(since_, Duration::zero(), out);
  if (line_open_) {
    out += '\n';
    line_open_ = false;
  }
  if (style_.fold) style_.fold->finish_rank(out);
}

std::optional<TimePoint> ConsoleLines::pending_since() const {
  if (pending_.empty() && !pending_cr_) return std::nullopt;
  return since_;
}

}  // namespace dlaunch
