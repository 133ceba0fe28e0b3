// libFuzzer target: the per-rank report reader (profiler/report.cpp step_report_from_json) and the
// merge and table built from what it accepts, on arbitrary JSON lines.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "profiler/report.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<fp8wire::prof::StepReport> steps;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const nlohmann::json j = nlohmann::json::parse(text.substr(start, end - start), nullptr, false);
    fp8wire::prof::StepReport r;
    std::string error;
    if (!j.is_discarded() && fp8wire::prof::step_report_from_json(j, r, error)) steps.push_back(std::move(r));
    start = end + 1;
  }
  const auto merged = fp8wire::prof::merge_ranks(steps, 5);
  (void)fp8wire::prof::format_table(merged);
  (void)fp8wire::prof::dump_json(fp8wire::prof::to_json(merged));
  return 0;
}
