#!/usr/bin/env bash
# One nccl-tests rank under mpiexec (scripts/gpu/nccl_tests.sh): its own emulated host
# (NCCL_HOSTID), every rank on GPU 0, libfp8wire.so preloaded into the test binary only (never into
# mpiexec or its proxies) when FP8WIRE_SHIM_LIB names it.
r="${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-${MPI_LOCALRANKID:-0}}}}"
export NCCL_HOSTID="emulated-host-${r}"
export NCCL_TESTS_DEVICE=0   # nccl-tests would pick GPU <local rank>: ranks share one hostname here
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
if [[ -n "${FP8WIRE_SHIM_LIB:-}" ]]; then
  export LD_PRELOAD="${FP8WIRE_SHIM_LIB}${LD_PRELOAD:+:$LD_PRELOAD}"
fi
exec "$@"
