#include "trainer/safetensors_header.hpp"

#include <algorithm>
#include <climits>

#include <fmt/format.h>

#include "common/input_limits.hpp"

namespace fp8wire::trainer {

namespace {

struct DtypeSize {
  const char* name;
  uint64_t bytes;
};
constexpr DtypeSize kDtypeSizes[] = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
                                     {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1}};

// "a string", "an array", ... for messages about a header value of the wrong JSON type.
std::string json_kind(const nlohmann::json& v) {
  if (v.is_string()) return "the string " + v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (v.is_number()) return "the number " + v.dump();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_null()) return "null";
  return v.is_array() ? "an array" : "an object";
}

}  // namespace

uint64_t safetensors_element_bytes(std::string_view dtype) {
  for (const auto& d : kDtypeSizes)
    if (dtype == d.name) return d.bytes;
  return 0;
}

std::string parse_safetensors_header(const std::string& path, std::string_view text, uint64_t file_size,
                                     std::map<std::string, SafetensorsHeaderEntry>& entries,
                                     std::map<std::string, std::string>* metadata, nlohmann::json& header) {
  const uint64_t data_start = 8 + uint64_t(text.size());
  if (data_start > file_size)
    return fmt::format("{}: header length {} does not fit the file ({} bytes): not a safetensors file", path,
                       text.size(), file_size);
  if (const std::string problem = json_check_text(text); !problem.empty())
    return fmt::format("{}: header: {}", path, problem);
  header = nlohmann::json::parse(text, nullptr, false);
  if (header.is_discarded() || !header.is_object()) return fmt::format("{}: header is not a JSON object", path);
  for (auto& [name, e] : header.items()) {
    if (name == "__metadata__") {
      if (!e.is_object()) return fmt::format("{}: __metadata__ is {}, expected an object", path, json_kind(e));
      if (metadata)
        for (auto& [k, v] : e.items()) (*metadata)[k] = v.is_string() ? v.get<std::string>() : v.dump();
      continue;
    }
    const std::string& tensor = name;  // a structured binding cannot be captured before C++20 in clang 14
    auto bad = [&](const std::string& what) { return fmt::format("{}: tensor '{}': {}", path, tensor, what); };
    if (!e.is_object()) return bad(fmt::format("entry is {}, expected an object", json_kind(e)));
    const auto dtype = e.find("dtype"), shape = e.find("shape"), offsets = e.find("data_offsets");
    if (dtype == e.end() || shape == e.end() || offsets == e.end()) return bad("lacks dtype/shape/data_offsets");
    SafetensorsHeaderEntry entry;
    if (!dtype->is_string()) return bad(fmt::format("dtype is {}, expected a string", json_kind(*dtype)));
    entry.dtype = dtype->get<std::string>();
    const uint64_t element = safetensors_element_bytes(entry.dtype);
    if (element == 0) return bad(fmt::format("unsupported dtype '{}'", entry.dtype));
    if (!shape->is_array()) return bad(fmt::format("shape is {}, expected an array", json_kind(*shape)));
    // The element count, guarded against overflow: no tensor can hold more bytes than the file.
    uint64_t numel = 1;
    for (const auto& d : *shape) {
      if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0))
        return bad(fmt::format("shape {} holds {}, expected non-negative integers", shape->dump(), json_kind(d)));
      const uint64_t dim = d.get<uint64_t>();
      if (dim > uint64_t(INT64_MAX) || (dim != 0 && numel > file_size / dim))
        return bad(fmt::format("shape {} is larger than the file ({} bytes)", shape->dump(), file_size));
      numel *= dim;
      entry.shape.push_back(int64_t(dim));
    }
    if (!offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
        !(*offsets)[1].is_number_unsigned())
      return bad(fmt::format("data_offsets is {}, expected [begin, end] (two non-negative integers)",
                             offsets->is_array() ? offsets->dump() : json_kind(*offsets)));
    const uint64_t begin = (*offsets)[0].get<uint64_t>(), end = (*offsets)[1].get<uint64_t>();
    if (begin > end || end > file_size - data_start || end - begin != numel * element)
      return bad(fmt::format("data_offsets [{}, {}] inconsistent with its shape {} of {} ({} bytes) or the file size",
                             begin, end, shape->dump(), entry.dtype, numel * element));
    entry.begin = data_start + begin;
    entry.bytes = end - begin;
    entries[name] = std::move(entry);
  }
  // Each tensor's bytes are its own: in file order, none starts before the previous one ends.
  std::vector<std::pair<uint64_t, const std::string*>> order;
  for (const auto& [name, e] : entries)
    if (e.bytes) order.emplace_back(e.begin, &name);
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 1; i < order.size(); ++i) {
    const SafetensorsHeaderEntry& prev = entries.at(*order[i - 1].second);
    const SafetensorsHeaderEntry& next = entries.at(*order[i].second);
    if (next.begin < prev.begin + prev.bytes)
      return fmt::format("{}: tensors '{}' (data_offsets [{}, {}]) and '{}' (data_offsets [{}, {}]) overlap; the "
                         "format gives every tensor bytes of its own",
                         path, *order[i - 1].second, prev.begin - data_start, prev.begin + prev.bytes - data_start,
                         *order[i].second, next.begin - data_start, next.begin + next.bytes - data_start);
  }
  return "";
}

}  // namespace fp8wire::trainer
