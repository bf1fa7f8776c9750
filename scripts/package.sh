#!/usr/bin/env bash
# Builds the Debian package: configures and builds build/ (scripts/build.sh; extra arguments go
# to cmake's configure step) and runs cpack there. Prints the path of the .deb.
#   scripts/package.sh  ->  build/package/dlaunch_<version>_amd64.deb
# Install it on every node with `apt-get install ./dlaunch_<version>_amd64.deb` (docs/quickstart.md).
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in dpkg-shlibdeps file; do
  command -v "$tool" >/dev/null || {
    echo "package.sh: $tool is missing; CPack needs it to compute the package's Depends." \
      "Install it with scripts/setup.sh (or apt-get install dpkg-dev file)" >&2
    exit 1
  }
done
scripts/build.sh "$@"
cd build
cpack -G DEB >/dev/null
ls -1 "$PWD"/package/dlaunch_*.deb
