// toml++, always header-only, for every file that parses TOML (common/config.cpp, trainer/config.cpp).
// libfp8wire.so must carry no libtomlplusplus.so dependency and the trainer must not need that
// library on the GPU machine. Debian's package config adds -DTOML_HEADER_ONLY=0 -DTOML_SHARED_LIB=1
// after our own definition, so the choice is made here, where it cannot be overridden. Debian 3.3
// ships toml++/toml.h; the upstream single header (carried to other machines) is toml++/toml.hpp.
#pragma once

#undef TOML_HEADER_ONLY
#define TOML_HEADER_ONLY 1
#undef TOML_SHARED_LIB

// toml++ states its parser's internal assumptions with TOML_ASSERT_ASSUME: assert() in a debug
// build, __builtin_assume in an optimised clang build. Invalid input breaks some of them (fuzzing
// found a table header that starts with no key and a time that starts with no digit), and a broken
// __builtin_assume is undefined behaviour; after each, the parser goes on to report the error
// itself, as it does in an optimised gcc build where the assumption is compiled out. So they are
// compiled out in every build: NDEBUG off while toml++ is read, and TOML_ASSERT a no-op.
#pragma push_macro("NDEBUG")
#undef NDEBUG
#undef TOML_ASSERT
#define TOML_ASSERT(expr) static_assert(true)
#if __has_include(<toml++/toml.hpp>)
#include <toml++/toml.hpp>
#else
#include <toml++/toml.h>
#endif
#pragma pop_macro("NDEBUG")
