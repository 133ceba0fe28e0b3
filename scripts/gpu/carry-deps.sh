#!/usr/bin/env bash
# Run HERE (the build machine with Debian packages) before a GPU-machine call: copies the
# header-only dependencies the GPU machine lacks (toml++; zlib's headers, whose run-time library it
# has) into .carry/include (git-ignored), which the
# device call carries and scripts/build.sh picks up.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
mkdir -p .carry/include
cp -r /usr/include/toml++ .carry/include/
cp /usr/include/zlib.h /usr/include/zconf.h .carry/include/
echo "carried: $(du -sh .carry | cut -f1)"
