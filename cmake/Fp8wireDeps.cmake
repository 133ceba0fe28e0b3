# Locates every dependency once, as imported targets the subdirectories link by name:
#   CUDA::cudart, CUDA::cupti, CUDA::nvtx3  (CUDA Toolkit)
#   fp8wire::nccl            headers + libnccl (only bench/tests link it; libfp8wire.so resolves NCCL at run time)
#   fp8wire::nccl_headers    headers only (the shim and sched)
#   fmt::fmt-header-only, tomlplusplus::tomlplusplus, doctest::doctest, CLI11::CLI11,
#   nlohmann_json::nlohmann_json, benchmark::benchmark, ZLIB::ZLIB
# Small libraries are used header-only where they can be, so a binary built on one machine does not
# need a matching shared fmt/toml++ on another.
find_package(CUDAToolkit 12.0 REQUIRED)

# NCCL: the toolkit's copy here; on the GPU machine the pip nvidia-nccl wheel PyTorch uses.
# FP8WIRE_NCCL_ROOT overrides both.
set(FP8WIRE_NCCL_ROOT "$ENV{FP8WIRE_NCCL_ROOT}" CACHE PATH "NCCL install prefix (include/nccl.h, lib/libnccl.so*)")
# A given root is searched alone and first: headers and library must come from the same NCCL (the
# pip wheel ships only libnccl.so.2, which a plain search would lose to a system libnccl.so).
if(FP8WIRE_NCCL_ROOT)
  find_path(NCCL_INCLUDE_DIR nccl.h PATHS ${FP8WIRE_NCCL_ROOT}/include NO_DEFAULT_PATH)
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR
    PATHS ${FP8WIRE_NCCL_ROOT}/lib ${FP8WIRE_NCCL_ROOT}/lib64 NO_DEFAULT_PATH)
endif()
find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/include /usr/local/include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR
  HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/lib/x86_64-linux-gnu)
if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
  message(FATAL_ERROR "NCCL not found (nccl.h: '${NCCL_INCLUDE_DIR}', libnccl: '${NCCL_LIBRARY}'). "
                      "Set -DFP8WIRE_NCCL_ROOT=<prefix with include/nccl.h and lib/libnccl.so.2>.")
endif()
message(STATUS "fp8wire: NCCL headers ${NCCL_INCLUDE_DIR}, library ${NCCL_LIBRARY}")
add_library(fp8wire_nccl_headers INTERFACE)
target_include_directories(fp8wire_nccl_headers SYSTEM INTERFACE ${NCCL_INCLUDE_DIR})
# nccl.h includes cuda_runtime.h; the pip wheel's copy sits apart from the toolkit's headers.
target_link_libraries(fp8wire_nccl_headers INTERFACE CUDA::toolkit)
add_library(fp8wire::nccl_headers ALIAS fp8wire_nccl_headers)
add_library(fp8wire_nccl INTERFACE)
target_link_libraries(fp8wire_nccl INTERFACE fp8wire_nccl_headers ${NCCL_LIBRARY})
add_library(fp8wire::nccl ALIAS fp8wire_nccl)

# FP8WIRE_EXTRA_INCLUDE: a folder of headers carried to machines that lack a package (toml++ on the
# GPU machine); searched before the system.
set(FP8WIRE_EXTRA_INCLUDE "$ENV{FP8WIRE_EXTRA_INCLUDE}" CACHE PATH "extra header-only dependencies")

find_package(fmt REQUIRED)

# toml++ is used header-only (TOML_HEADER_ONLY=1, set where it is included: common/config.cpp) so
# libfp8wire.so carries no libtomlplusplus.so dependency. The package's own CMake config is not used:
# Debian's adds TOML_SHARED_LIB=1. Debian 3.3 ships toml++/toml.h, upstream's carried copy toml.hpp.
find_path(TOMLPP_INCLUDE_DIR NAMES toml++/toml.hpp toml++/toml.h HINTS ${FP8WIRE_EXTRA_INCLUDE} REQUIRED)
add_library(fp8wire_tomlplusplus INTERFACE)
target_include_directories(fp8wire_tomlplusplus SYSTEM INTERFACE ${TOMLPP_INCLUDE_DIR})
add_library(tomlplusplus::tomlplusplus ALIAS fp8wire_tomlplusplus)

# A header-only library as <package>::<package>: its own CMake config where one is installed, else
# the folder that holds <header> (a distribution's or FP8WIRE_EXTRA_INCLUDE's copy without one).
function(fp8wire_header_only package header)
  find_package(${package} QUIET)
  if(NOT TARGET ${package}::${package})
    find_path(${package}_HEADER_DIR ${header} HINTS ${FP8WIRE_EXTRA_INCLUDE} REQUIRED)
    add_library(${package}_${package} INTERFACE)
    target_include_directories(${package}_${package} SYSTEM INTERFACE ${${package}_HEADER_DIR})
    add_library(${package}::${package} ALIAS ${package}_${package})
  endif()
endfunction()
fp8wire_header_only(doctest doctest/doctest.h)
fp8wire_header_only(CLI11 CLI/CLI.hpp)

find_package(nlohmann_json 3 REQUIRED)

# zlib: fp8wire-prof reads gzip traces, the trainer checksums checkpoints (CRC-32). A machine with
# only the run-time library (libz.so.1) and the headers carried in FP8WIRE_EXTRA_INCLUDE
# (scripts/dev/carry-deps.sh) builds too.
find_path(ZLIB_INCLUDE_DIR zlib.h HINTS ${FP8WIRE_EXTRA_INCLUDE})
find_library(ZLIB_LIBRARY NAMES z libz.so.1 NAMES_PER_DIR)
find_package(ZLIB REQUIRED)
find_package(benchmark QUIET)   # optional: only the host-side microbenchmarks use it

# NVTX3 is header-only and ships with the toolkit.
if(NOT TARGET CUDA::nvtx3)
  add_library(fp8wire_nvtx3 INTERFACE)
  target_include_directories(fp8wire_nvtx3 SYSTEM INTERFACE ${CUDAToolkit_INCLUDE_DIRS})
  add_library(CUDA::nvtx3 ALIAS fp8wire_nvtx3)
endif()

# Adds a doctest executable as a CTest test. GPU tests pass LABELS gpu and skip themselves at run time
# when no device is visible (exit code 0 with a "skipped" message, and SKIP_RETURN_CODE for ctest).
# fp8wire_add_test(<program> [NAME <test>] SOURCES ... LIBS ... [ARGS ...] LABELS ... TIMEOUT s): a
# test program and its ctest test. Test names are <area>_<what> (NAME, default the program's name); the
# GPU tier ends in _gpu. Exit code 77 is a skip. The name -> program pairs go to fp8wire_targets.txt for
# the sanitizer tier (scripts/sanitize.sh), which runs tests before their programs exist.
function(fp8wire_add_test program)
  cmake_parse_arguments(T "" "TIMEOUT;NAME" "SOURCES;LIBS;LABELS;ARGS" ${ARGN})
  add_executable(${program} ${T_SOURCES})
  target_link_libraries(${program} PRIVATE ${T_LIBS})
  if(NOT T_NAME)
    set(T_NAME ${program})
  endif()
  fp8wire_add_test_of(${program} NAME ${T_NAME} ARGS ${T_ARGS} LABELS ${T_LABELS} TIMEOUT ${T_TIMEOUT})
endfunction()

# fp8wire_add_failure_tests(<prefix> COMMAND <command...> [ABSENT <text>] TIMEOUT s CASES <case>...): a
# command refusing bad input, one cpu test <prefix>_<name> per case "<name>|<expected>|<arg>|<arg>...":
# the command run with those arguments must fail with an error status, <expected> in its output and,
# with ABSENT, not <text> (tests/common/expect_failure.sh).
function(fp8wire_add_failure_tests prefix)
  cmake_parse_arguments(F "" "TIMEOUT;ABSENT" "COMMAND;CASES" ${ARGN})
  set(absent "")
  if(F_ABSENT)
    set(absent --absent "${F_ABSENT}")
  endif()
  foreach(case IN LISTS F_CASES)
    string(REPLACE "|" ";" parts "${case}")
    list(GET parts 0 name)
    list(GET parts 1 expected)
    list(SUBLIST parts 2 -1 args)
    add_test(NAME ${prefix}_${name}
      COMMAND sh ${PROJECT_SOURCE_DIR}/tests/common/expect_failure.sh "${expected}" ${absent} -- ${F_COMMAND} ${args})
    set_tests_properties(${prefix}_${name} PROPERTIES LABELS cpu TIMEOUT ${F_TIMEOUT})
  endforeach()
endfunction()

# fp8wire_add_test_of(<program> NAME <test> [ARGS ...] LABELS ... TIMEOUT s): a further ctest test of
# a program fp8wire_add_test made, with its own arguments (a doctest filter: part of a program's cases
# under a time limit of their own).
function(fp8wire_add_test_of program)
  cmake_parse_arguments(T "" "TIMEOUT;NAME" "LABELS;ARGS" ${ARGN})
  add_test(NAME ${T_NAME} COMMAND ${program} ${T_ARGS})
  set_property(GLOBAL APPEND PROPERTY FP8WIRE_TEST_PROGRAMS "${T_NAME} ${program}")
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT} SKIP_RETURN_CODE 77)
  if(T_LABELS)
    set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}")
  endif()
endfunction()
