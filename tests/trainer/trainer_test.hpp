// What the trainer's CPU tests share (test_trainer.cpp, test_trainer_inputs.cpp): doctest after
// LibTorch, whose c10 defines glog-style CHECK macros that doctest's must win over (included after
// every LibTorch header; the file that is the program's main defines DOCTEST_CONFIG_IMPLEMENT first),
// and the tiny preset they train.
#pragma once

#include <string>

#include "trainer/config.hpp"

#undef CHECK
#undef CHECK_EQ
#undef CHECK_NE
#undef CHECK_LT
#undef CHECK_LE
#undef CHECK_GT
#undef CHECK_GE
#undef CHECK_NOTNULL
#include <doctest/doctest.h>

// trainer/configs/tiny.toml, read as fp8wire-train reads it.
inline fp8wire::trainer::Config tiny_config() {
  fp8wire::trainer::Config c;
  const std::string err =
      fp8wire::trainer::load_config_file(std::string(FP8WIRE_TRAINER_CONFIG_DIR) + "/tiny.toml", c);
  REQUIRE_MESSAGE(err.empty(), err);
  return c;
}
