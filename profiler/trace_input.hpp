// Reads a trace file as a stream of bytes, gzip-compressed or not (torch.profiler writes
// `.json.gz` when asked to, and users compress large traces themselves): zlib's gz* functions
// recognise the gzip header and pass any other file through unchanged, so one reader serves both and
// the file name's extension does not matter. Streaming keeps memory independent of the file size;
// the text is checked against JSON input limits as it streams (common/input_limits.hpp: nesting
// depth, the length of one string or number, the whole text), so neither a deep nesting nor a token
// or a decompressed stream of gigabytes reaches the parser.
#pragma once

#include <streambuf>
#include <string>
#include <vector>

#include "common/input_limits.hpp"

namespace fp8wire::prof {

class TraceInput : public std::streambuf {
 public:
  TraceInput() = default;
  ~TraceInput() override;
  TraceInput(const TraceInput&) = delete;
  TraceInput& operator=(const TraceInput&) = delete;

  // False with `error` set ("cannot open '<path>': <reason>") when the file cannot be read.
  bool open(const std::string& path, std::string& error, JsonLimits limits = {});
  // After the stream ended: "" or why it ended early ("corrupt gzip data: ...", an I/O error, "line
  // L, column C: <the limit passed>").
  const std::string& read_error() const { return read_error_; }
  bool compressed() const { return compressed_; }

 protected:
  int_type underflow() override;

 private:
  void* file_ = nullptr;  // gzFile
  std::vector<char> buffer_;
  std::string read_error_;
  bool compressed_ = false;
  JsonScan scan_;
};

}  // namespace fp8wire::prof
