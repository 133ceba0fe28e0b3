// The JSON header of a safetensors file, parsed and checked without LibTorch: the trainer's reader
// (data.cpp) builds tensors from what it returns, and the fuzz target fuzz_safetensors_header
// (tests/fuzz/) drives it alone. Format: 8-byte little-endian header length, the JSON header
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}, then the tensor
// bytes, offsets counted from the end of the header.
//
// Nothing is allocated for a tensor before every entry has passed: types, sizes that overflow or
// overrun the file, and ranges that overlap another tensor's (the format forbids it; without the
// check, entries that each span the whole file would make a reader allocate that many times its
// size). The text is checked against common/input_limits.hpp first (nesting depth), since the
// header is parsed into nlohmann-json values that are copied and printed by recursion.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace fp8wire::trainer {

// The largest header read, by its 8-byte length (the format allows 100 MB).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100u << 20;

struct SafetensorsHeaderEntry {
  std::string dtype;            // the format's name: F32, BF16, I64, BOOL, ...
  std::vector<int64_t> shape;
  uint64_t begin = 0;           // absolute file offset of the first byte
  uint64_t bytes = 0;
};

// Bytes per element of a dtype the trainer reads (F64, F32, F16, BF16, I64, I32, I16, I8, U8,
// BOOL), 0 for any other name.
uint64_t safetensors_element_bytes(std::string_view dtype);

// Parses `text`, the header of `path` (a file of `file_size` bytes whose tensor bytes start right
// after it, at 8 + text.size()). Returns "" or an error naming the file and the entry. `header` is
// the parsed JSON (for the checksum); `metadata` receives __metadata__, values that are not strings
// as their JSON text.
std::string parse_safetensors_header(const std::string& path, std::string_view text, uint64_t file_size,
                                     std::map<std::string, SafetensorsHeaderEntry>& entries,
                                     std::map<std::string, std::string>* metadata, nlohmann::json& header);

}  // namespace fp8wire::trainer
