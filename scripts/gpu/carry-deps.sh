#!/usr/bin/env bash
# Run on a machine with the Debian packages before building on a GPU machine without apt or network:
# copies the header-only dependencies such a machine lacks (toml++; zlib's headers, whose run-time
# library it has) into .carry/include (git-ignored); copy that folder with the tree, and
# scripts/build.sh picks it up.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
mkdir -p .carry/include
cp -r /usr/include/toml++ .carry/include/
cp /usr/include/zlib.h /usr/include/zconf.h .carry/include/
echo "carried: $(du -sh .carry | cut -f1)"
