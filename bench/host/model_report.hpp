// fp8wire-bench model: crossovers predicted by the alpha-beta model (model.hpp), calibrated with this
// GPU's codec throughput, for the fabrics in assumed_links(), and checked against every fabric that
// was measured (predicted vs measured crossover, with the error).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/host/results.hpp"

namespace fp8wire::bench {

struct ModelOptions {
  std::vector<int> nranks = {8};           // world sizes to predict for (besides each sweep's own)
  std::optional<double> codec_gbps;        // override the measured codec throughput
  std::optional<double> launch_us;
  DType dtype = DType::bf16;
  CrossoverOptions crossover;
};

struct ModelReport {
  std::string text;     // the terminal report
  nlohmann::json json;  // the same, machine-readable
};

ModelReport model_report(const std::vector<SweepResult>& sweeps, const ModelOptions& options);

}  // namespace fp8wire::bench
