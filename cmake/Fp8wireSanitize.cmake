# The sanitizer and fuzz tier (scripts/sanitize.sh), in build folders of their own:
#   FP8WIRE_SANITIZE=ON  host C/C++ code with AddressSanitizer + UndefinedBehaviorSanitizer, every
#                        finding fatal (gcc or clang; no CUDA flags: the tier builds no .cu file);
#   FP8WIRE_FUZZ=ON      the libFuzzer targets of tests/fuzz (clang), and coverage instrumentation
#                        of all host code so the fuzzers see inside the libraries they drive.
# fp8wire_write_host_targets() (called after every subdirectory) lists each executable and shared
# library with whether it, or anything it links or depends on inside the project, has CUDA sources:
# the script builds and tests only the host ones, so new host tests join the tier on their own and
# no CUDA target is ever compiled there.
option(FP8WIRE_SANITIZE "build host code with ASan + UBSan (sanitizer tier, own build folder)" OFF)
option(FP8WIRE_FUZZ "build the libFuzzer targets in tests/fuzz (clang only)" OFF)

if(FP8WIRE_SANITIZE)
  set(_fp8wire_san -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${_fp8wire_san}>")
  add_link_options("$<$<LINK_LANGUAGE:C,CXX>:-fsanitize=address,undefined>")
endif()
if(FP8WIRE_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "FP8WIRE_FUZZ needs clang (libFuzzer): -DCMAKE_CXX_COMPILER=clang++")
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link>")
endif()

# fp8wire_sanitize_optimise(<target>...): in the sanitizer tier, these targets at -O1 instead of the
# tier's -O0 (the option comes after the tier's flags, so it wins). For the code the simulated-machine
# tests spend their minutes in: under ASan it runs about 3x faster at -O1 (the direct transports' test
# 1475 -> 481 s on 2 cores), with the same checks, while the rest of the tier (LibTorch's headers
# above all) keeps -O0's short compile.
function(fp8wire_sanitize_optimise)
  if(FP8WIRE_SANITIZE)
    foreach(_t IN LISTS ARGN)
      target_compile_options(${_t} PRIVATE "$<$<COMPILE_LANGUAGE:C,CXX>:-O1>")
    endforeach()
  endif()
endfunction()

# Whether `target` (or an in-project target it links or depends on) compiles CUDA; memoised in
# global properties.
function(_fp8wire_target_has_cuda target out)
  get_target_property(_real ${target} ALIASED_TARGET)
  if(_real)
    set(target ${_real})
  endif()
  get_property(_known GLOBAL PROPERTY _fp8wire_cuda_${target} SET)
  if(_known)
    get_property(_value GLOBAL PROPERTY _fp8wire_cuda_${target})
    set(${out} ${_value} PARENT_SCOPE)
    return()
  endif()
  set_property(GLOBAL PROPERTY _fp8wire_cuda_${target} OFF)  # cycles end here
  set(_cuda OFF)
  get_target_property(_imported ${target} IMPORTED)
  if(NOT _imported)
    get_target_property(_type ${target} TYPE)
    set(_sources "")
    if(NOT _type STREQUAL "INTERFACE_LIBRARY")
      get_target_property(_sources ${target} SOURCES)
    endif()
    foreach(_s IN LISTS _sources)
      if(_s MATCHES "\\.cu$")
        set(_cuda ON)
      endif()
    endforeach()
    set(_deps "")
    foreach(_p LINK_LIBRARIES INTERFACE_LINK_LIBRARIES MANUALLY_ADDED_DEPENDENCIES)
      if(_type STREQUAL "INTERFACE_LIBRARY" AND NOT _p STREQUAL "INTERFACE_LINK_LIBRARIES")
        continue()
      endif()
      get_target_property(_v ${target} ${_p})
      if(_v)
        list(APPEND _deps ${_v})
      endif()
    endforeach()
    foreach(_d IN LISTS _deps)
      string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" _d "${_d}")
      if(NOT _cuda AND TARGET "${_d}")
        _fp8wire_target_has_cuda(${_d} _dep_cuda)
        if(_dep_cuda)
          set(_cuda ON)
        endif()
      endif()
    endforeach()
  endif()
  set_property(GLOBAL PROPERTY _fp8wire_cuda_${target} ${_cuda})
  set(${out} ${_cuda} PARENT_SCOPE)
endfunction()

function(_fp8wire_collect_targets dir out)
  get_property(_targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(_subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(_sub IN LISTS _subdirs)
    _fp8wire_collect_targets(${_sub} _more)
    list(APPEND _targets ${_more})
  endforeach()
  set(${out} ${_targets} PARENT_SCOPE)
endfunction()

# Writes <build>/fp8wire_targets.txt: "<host|cuda> <target> <file>" per executable and shared library,
# and "test <test name> <program target>" per fp8wire_add_test.
function(fp8wire_write_host_targets)
  _fp8wire_collect_targets(${PROJECT_SOURCE_DIR} _all)
  set(_lines "")
  foreach(_t IN LISTS _all)
    get_target_property(_type ${_t} TYPE)
    if(NOT _type MATCHES "^(EXECUTABLE|SHARED_LIBRARY|MODULE_LIBRARY)$")
      continue()
    endif()
    _fp8wire_target_has_cuda(${_t} _cuda)
    if(_cuda)
      string(APPEND _lines "cuda ${_t} $<TARGET_FILE:${_t}>\n")
    else()
      string(APPEND _lines "host ${_t} $<TARGET_FILE:${_t}>\n")
    endif()
  endforeach()
  get_property(_tests GLOBAL PROPERTY FP8WIRE_TEST_PROGRAMS)
  foreach(_pair IN LISTS _tests)
    string(APPEND _lines "test ${_pair}\n")
  endforeach()
  file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/fp8wire_targets.txt CONTENT "${_lines}")
endfunction()
