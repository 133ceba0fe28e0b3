// libFuzzer target: the safetensors header reader (trainer/safetensors_header.cpp, compiled in: it
// needs nlohmann-json and fmt only). Input: the file's size in decimal on the first line (as the
// reader gets it from fstat), then the JSON header. Every problem must come back as an error naming
// the file; nothing may crash or trip a sanitizer, whatever the nesting. Oracles on success: every
// tensor lies inside the file's data, holds exactly its shape's bytes, and no two overlap.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "trainer/safetensors_header.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  uint64_t file_size = 8 + text.size() + 4096;  // without a first line: room for a few tensors
  if (const size_t eol = text.find('\n'); eol != std::string_view::npos && eol > 0 && eol <= 20 &&
                                          text.substr(0, eol).find_first_not_of("0123456789") == std::string_view::npos) {
    file_size = 0;
    for (const char c : text.substr(0, eol)) file_size = file_size * 10 + uint64_t(c - '0');  // wraps: any size
    text.remove_prefix(eol + 1);
  }
  std::map<std::string, fp8wire::trainer::SafetensorsHeaderEntry> entries;
  std::map<std::string, std::string> metadata;
  nlohmann::json header;
  const std::string error =
      fp8wire::trainer::parse_safetensors_header("fuzz.safetensors", text, file_size, entries, &metadata, header);
  if (!error.empty()) {
    if (error.rfind("fuzz.safetensors: ", 0) != 0) std::abort();  // every error names the file
    return 0;
  }
  (void)header.dump();  // recursion over an accepted header stays within the nesting limit
  const uint64_t data_start = 8 + text.size();
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, e] : entries) {
    uint64_t numel = 1;
    for (const int64_t d : e.shape) numel *= uint64_t(d);
    if (e.begin < data_start || e.begin > file_size || e.bytes > file_size - e.begin) std::abort();
    if (e.bytes != numel * fp8wire::trainer::safetensors_element_bytes(e.dtype)) std::abort();
    if (e.bytes) ranges.emplace_back(e.begin, e.begin + e.bytes);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) std::abort();  // overlapping tensors accepted
  return 0;
}
