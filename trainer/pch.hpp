// Precompiled for every trainer translation unit: LibTorch's headers are most of the build time.
#pragma once
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/autograd.h>
#include <fmt/format.h>
