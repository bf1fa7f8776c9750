#!/usr/bin/env bash
# Builds the Debian package: configures build/ if needed (extra arguments go to cmake's
# configure step, as for scripts/build.sh), builds what the package holds (dlaunch, dtrain, man
# pages, completion: not the tests and benchmarks) and runs cpack there. Prints the .deb's path.
#   scripts/package.sh  ->  build/package/dlaunch_<version>_amd64.deb
# Install it on every node with `apt-get install ./dlaunch_<version>_amd64.deb` (docs/install.md).
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in cmake cpack dpkg-shlibdeps file; do
  command -v "$tool" >/dev/null || {
    echo "package.sh: $tool is missing; expected the build dependencies and dpkg-dev (CPack" \
      "computes the package's Depends with dpkg-shlibdeps). Run scripts/setup.sh first" >&2
    exit 1
  }
done
DLAUNCH_BUILD_TARGET=dlaunch_installables scripts/build.sh "$@"
cd build
cpack -G DEB >/dev/null
ls -1 "$PWD"/package/dlaunch_*.deb
