#!/usr/bin/env bash
# What the direct transports rely on, on this GPU machine (scripts/gpu/all.sh direct_probe, ~1 min):
# stream memory operations on shared host memory between two processes, their graph capture and host
# release, CUDA IPC between processes of one GPU, and kernel load/store bandwidth to mapped host
# memory against cudaMemcpyAsync's, and the pipeline's copies in both directions at once with and
# without its handshakes (bench/direct_probe.cu says what each line means). PROBE_LIST: some of
# caps,pingpong,graph,ipc,bandwidth,starve,duplex,duplex_gated,duplex_fused (default all); PROBE_MIB: the bulk region (256).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_mps_start
gpu_out direct-probe
probe="$BUILD/bench/fp8wire-direct-probe"
[[ -x "$probe" ]] || { echo "FAIL: $probe not built (cmake --build $BUILD --target fp8wire-direct-probe)"; exit 1; }
timeout -k 5 "${PROBE_LIMIT_S:-90}" "$probe" "${PROBE_MIB:-256}" ${PROBE_LIST:+"$PROBE_LIST"} 2>&1 | tee "$OUT/direct_probe.txt"
exit "${PIPESTATUS[0]}"
