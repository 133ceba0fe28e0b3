// Reads a trace file as a stream of bytes, gzip-compressed or not (torch.profiler writes
// `.json.gz` when asked to, and users compress large traces themselves): zlib's gz* functions
// recognise the gzip header and pass any other file through unchanged, so one reader serves both and
// the file name's extension does not matter. Streaming keeps memory independent of the file size.
#pragma once

#include <streambuf>
#include <string>
#include <vector>

namespace fp8wire::prof {

class TraceInput : public std::streambuf {
 public:
  TraceInput() = default;
  ~TraceInput() override;
  TraceInput(const TraceInput&) = delete;
  TraceInput& operator=(const TraceInput&) = delete;

  // False with `error` set ("cannot open '<path>': <reason>") when the file cannot be read.
  bool open(const std::string& path, std::string& error);
  // After the stream ended: "" or why it ended early ("corrupt gzip data: ...", an I/O error).
  const std::string& read_error() const { return read_error_; }
  bool compressed() const { return compressed_; }

 protected:
  int_type underflow() override;

 private:
  void* file_ = nullptr;  // gzFile
  std::vector<char> buffer_;
  std::string read_error_;
  bool compressed_ = false;
};

}  // namespace fp8wire::prof
