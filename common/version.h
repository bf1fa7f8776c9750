// The version of dlaunch and dtrain and the git commit they were built from, for --version.
// All come from the build: CMake's project VERSION and `git rev-parse --short HEAD` at
// configure time ("unknown" outside a git checkout, e.g. a source tarball); CMake configures
// again when HEAD moves, so a build tree kept across commits does not report an old commit
// (common/CMakeLists.txt). One place serves both binaries; link dlaunch_version (its own library,
// so a new commit relinks only what prints it).
#pragma once

#include <string>

namespace dlaunch {

// "0.1.0"
const char* version();
// "e8ba0f2", or "unknown"
const char* git_commit();
// CMAKE_BUILD_TYPE: "Release", "Debug", ...; a Debug or sanitizer build is slow, and a report
// from one should say so.
const char* build_type();
// "dlaunch 0.1.0 (commit e8ba0f2, Release build)\n": what `<program> --version` prints.
std::string version_text(const std::string& program);

}  // namespace dlaunch
