#!/usr/bin/env bash
# Run on a build machine with the Debian packages installed, before copying the tree to a GPU machine
# without apt: copies the header-only dependencies such a machine lacks (toml++; zlib's headers, whose
# run-time library it has) into .carry/include (git-ignored), which scripts/build.sh and
# scripts/main-job.sh pick up there.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
mkdir -p .carry/include
cp -r /usr/include/toml++ .carry/include/
cp /usr/include/zlib.h /usr/include/zconf.h .carry/include/
echo "copied into .carry: $(du -sh .carry | cut -f1)"
