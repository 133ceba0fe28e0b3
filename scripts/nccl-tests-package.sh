#!/usr/bin/env bash
# Builds NVIDIA's nccl-tests with MPI for scripts/gpu/nccl_tests.sh and packs them with their MPI, for
# a GPU machine that has CUDA and NCCL but no MPI and nothing installable: all_reduce_perf,
# alltoall_perf and sendrecv_perf, built with MPI=1 against the MPICH of the `mpich` pip wheel, which
# the archive carries in its mpi/ folder (bin/mpiexec.hydra, lib/: the runner puts it on the library
# path), and with CUDA's runtime linked in (the GPU machine's own may be another minor version). Runs
# on any machine with nvcc and NCCL's headers; no GPU needed.
#   NCCL_TESTS_SRC=path/to/nccl-tests [NCCL_HOME=/usr/local] [CUDA_ARCH=90] scripts/nccl-tests-package.sh [OUT.tar.gz]
# OUT defaults to .carry/nccl-tests.tar.gz, where scripts/gpu/nccl_tests.sh looks for it.
source "$(dirname "${BASH_SOURCE[0]}")/prologue.sh"
src="${NCCL_TESTS_SRC:?set NCCL_TESTS_SRC to a checkout of https://github.com/NVIDIA/nccl-tests}"
out="$(realpath -m "${1:-.carry/nccl-tests.tar.gz}")"
arch="${CUDA_ARCH:-90}"
[[ -f "$src/src/alltoall.cu" ]] || { echo "nccl-tests-package: $src has no src/alltoall.cu: expected a checkout of nccl-tests"; exit 1; }
nccl_home="${NCCL_HOME:-}"
if [[ -z "$nccl_home" ]]; then
  for d in /usr/local /usr/local/cuda /usr; do [[ -f "$d/include/nccl.h" ]] && { nccl_home="$d"; break; }; done
fi
[[ -f "$nccl_home/include/nccl.h" ]] || { echo "nccl-tests-package: no include/nccl.h under NCCL_HOME='$nccl_home': set NCCL_HOME"; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
pkg="$work/nccl-tests"
mkdir -p "$pkg/mpi"
python3 -m pip download --quiet --no-deps -d "$work/wheel" mpich
python3 -m zipfile -e "$work"/wheel/mpich-*.whl "$work/mpich"
cp -a "$work"/mpich/mpich-*.data/data/{bin,lib,include} "$pkg/mpi/"
chmod +x "$pkg"/mpi/bin/*  # zipfile extraction keeps no modes
cp -a "$src" "$work/src"
make -C "$work/src/src" -j"$JOBS" MPI=1 MPI_HOME="$pkg/mpi" CUDA_HOME=/usr/local/cuda NCCL_HOME="$nccl_home" \
  NVCC_GENCODE="-gencode=arch=compute_${arch},code=sm_${arch}" CUDARTLIB=cudart_static BUILDDIR="$work/build" \
  os.build "$work/build/all_reduce_perf" "$work/build/alltoall_perf" "$work/build/sendrecv_perf" > "$work/make.log" 2>&1 ||
  { tail -30 "$work/make.log"; exit 1; }
cp "$work"/build/{all_reduce_perf,alltoall_perf,sendrecv_perf} "$pkg/"
rm -rf "$pkg/mpi/include"
mkdir -p "$(dirname "$out")"
tar czf "$out" -C "$work" nccl-tests
echo "nccl-tests-package: $out ($(du -h "$out" | cut -f1): all_reduce_perf alltoall_perf sendrecv_perf + MPICH, sm_$arch) in $(( $(date +%s) - START )) s"
