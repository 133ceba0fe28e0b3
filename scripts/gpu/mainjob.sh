#!/usr/bin/env bash
# The README's main job inside a batched GPU call (scripts/gpu/all.sh mainjob): the build already
# exists; results go under $OUT/main. MAIN_ENV="VAR=value ..." adds environment for both runs
# (baseline and fp8wire alike), e.g. an NCCL setting under test.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
env ${MAIN_ENV:-} SKIP_BUILD=1 MAIN_OUT="${OUT:-out}/main" STEPS="${MAIN_STEPS:-30}" bash scripts/main-job.sh
