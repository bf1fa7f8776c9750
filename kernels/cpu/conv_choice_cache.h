// The per-host file that remembers which convolution implementation won the autotuning
// (kernels/cpu/conv2d.cc), so a second run on the same machine skips the trials.
//
// Keys are opaque strings built by conv2d.cc: the pass, the shape without the batch size, and a
// context (oneDNN version, effective ISA, CPU model, OpenMP threads) so a file shared between
// machines (an NFS home) or runs with other thread counts never hands over a foreign choice.
//
// File format (text, one record per line):
//   dlaunch-conv-choices 1
//   <key> <variant>                     (any number; key and variant without spaces)
//   end <records> <checksum>            (FNV-1a 64 of every byte before this line, in hex)
// A file that does not match exactly (truncated, edited, another version) is ignored as a whole
// with one warning naming it and the reason, and replaced at the next write.
//
// Writes: read-merge-write under an exclusive flock on "<path>.lock" (ranks on one host share the
// file), through "<path>.tmp.<pid>" renamed over <path>, so a reader sees the old file or the new
// one. A cache that cannot be written (read-only home, full disk) warns once and then only reads.
//
// Thread safety: none; the caller serialises (conv2d.cc holds a mutex). Blocks on small file I/O
// and on the lock file (held only for a read and a write). Never throws: a cache must not stop
// training.
#pragma once

#include <map>
#include <optional>
#include <string>

namespace dlaunch::kernels::cpu {

class ConvChoiceCache {
 public:
  // `path` empty: memory only (nothing read or written).
  explicit ConvChoiceCache(std::string path);

  // The variant recorded for `key` in memory or, on a miss, in the file as it is now (another
  // rank may have written it since we last read).
  std::optional<std::string> lookup(const std::string& key);
  // Remembers the choice and merges it into the file.
  void record(const std::string& key, const std::string& variant);
  const std::string& path() const { return path_; }

  // The file format, exposed for tests. parse() throws std::runtime_error saying what is wrong.
  static std::map<std::string, std::string> parse(const std::string& text);
  static std::string serialize(const std::map<std::string, std::string>& entries);

  // Where the cache lives: DLAUNCH_CONV_CACHE (a file path, or "off" for none), else
  // $XDG_CACHE_HOME/dlaunch/conv_choices.txt, else $HOME/.cache/dlaunch/conv_choices.txt, else
  // none (empty).
  static std::string default_path();

 private:
  void load_file();  // merges the file's entries into entries_ (file errors: warn, ignore)

  std::string path_;
  std::map<std::string, std::string> entries_;
  bool warned_corrupt_ = false;
  bool writable_ = true;
};

}  // namespace dlaunch::kernels::cpu
