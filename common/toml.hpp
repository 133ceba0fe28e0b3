// toml++, always header-only, for every file that parses TOML (common/config.cpp, trainer/config.cpp).
// libfp8wire.so must carry no libtomlplusplus.so dependency and the trainer must not need that
// library on the GPU machine. Debian's package config adds -DTOML_HEADER_ONLY=0 -DTOML_SHARED_LIB=1
// after our own definition, so the choice is made here, where it cannot be overridden. Debian 3.3
// ships toml++/toml.h; the upstream single header (carried to other machines) is toml++/toml.hpp.
#pragma once

#undef TOML_HEADER_ONLY
#define TOML_HEADER_ONLY 1
#undef TOML_SHARED_LIB
#if __has_include(<toml++/toml.hpp>)
#include <toml++/toml.hpp>
#else
#include <toml++/toml.h>
#endif
