# install(): what an installation of fp8wire holds, for `cmake --install` and for the Python wheel
# (pyproject.toml builds it with scikit-build-core from this same CMake project).
#   component fp8wire: libfp8wire.so, libfp8wire_prof.so, fp8wire-config, fp8wire-bench, fp8wire-prof,
#   and the C API header fp8wire.h.
#   The trainer and the tests are not installed.
# Layout: bin/ and lib/ under the prefix; in the wheel, fp8wire/bin and fp8wire/lib inside the Python
# package, where the `fp8wire` module looks for them. fp8wire-prof finds the libraries as ../lib
# from its own folder in both layouts.
if(SKBUILD)
  set(_fp8wire_bindir fp8wire/bin)
  set(_fp8wire_libdir fp8wire/lib)
  set(_fp8wire_includedir fp8wire/include)
else()
  set(_fp8wire_bindir bin)
  set(_fp8wire_libdir lib)
  set(_fp8wire_includedir include)
endif()
set(FP8WIRE_INSTALL_BINDIR "${_fp8wire_bindir}" CACHE STRING "where the fp8wire tools are installed (relative to the prefix)")
set(FP8WIRE_INSTALL_LIBDIR "${_fp8wire_libdir}" CACHE STRING "where libfp8wire.so and libfp8wire_prof.so are installed")

# Run paths of the installed programs. libfp8wire.so needs none: it finds NCCL at run time (the one
# the job loaded) and carries the CUDA runtime statically. fp8wire-bench links NCCL and
# libfp8wire_prof.so links CUPTI; in the wheel both look first in the NVIDIA pip packages that
# PyTorch installs beside it in site-packages (nvidia/nccl/lib, nvidia/cu13/lib), so the benchmark
# uses the same NCCL as the job. RUNPATH, not RPATH: LD_LIBRARY_PATH still chooses another.
if(SKBUILD)
  set(_fp8wire_site "$ORIGIN/../..")
  set_target_properties(fp8wire-bench PROPERTIES INSTALL_RPATH "${_fp8wire_site}/nvidia/nccl/lib")
  set_target_properties(fp8wire_prof PROPERTIES
    INSTALL_RPATH "${_fp8wire_site}/nvidia/cu13/lib;${_fp8wire_site}/nvidia/cuda_cupti/lib")
else()
  set_target_properties(fp8wire-bench fp8wire_prof PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)
endif()

install(TARGETS fp8wire fp8wire_prof
        LIBRARY DESTINATION "${FP8WIRE_INSTALL_LIBDIR}" COMPONENT fp8wire)
install(TARGETS fp8wire-config fp8wire-bench fp8wire-prof
        RUNTIME DESTINATION "${FP8WIRE_INSTALL_BINDIR}" COMPONENT fp8wire)
# The C API (fp8wire_active, fp8wire_get_totals, ...), for programs that are not Python.
install(FILES "${PROJECT_SOURCE_DIR}/shim/fp8wire.h" DESTINATION "${_fp8wire_includedir}" COMPONENT fp8wire)
