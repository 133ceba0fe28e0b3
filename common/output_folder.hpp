#pragma once
// A folder a tool creates for its results (fp8wire-prof's reports, fp8wire-bench's sweep files).
// A run that fails before writing anything must not leave it behind: the user would find an empty
// folder and wonder what ran. So the folder remembers which part of its path it created, and
// remove_if_empty() takes back exactly that part, as far as it is still empty: a folder that existed
// before, or that holds anything (the job's own files), stays.
#include <filesystem>
#include <string>
#include <system_error>

#include <fmt/format.h>

namespace fp8wire {

class OutputFolder {
 public:
  // Creates `dir` and its missing parents. False, with `error` saying why, when it cannot be made or
  // exists as something else than a folder.
  bool create(const std::filesystem::path& dir, std::string& error) {
    namespace fs = std::filesystem;
    std::error_code ec;
    dir_ = fs::absolute(dir, ec).lexically_normal();
    if (ec) {
      error = fmt::format("cannot create the folder '{}': {}", dir.string(), ec.message());
      return false;
    }
    if (!dir_.has_filename()) dir_ = dir_.parent_path();  // "out/prof/": the folder is out/prof
    created_.clear();
    for (fs::path p = dir_; !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
      created_ = p;
      if (p == p.parent_path()) break;
    }
    fs::create_directories(dir_, ec);
    if (ec || !fs::is_directory(dir_, ec)) {
      error = fmt::format("cannot create the folder '{}': {}", dir.string(),
                          ec ? ec.message() : "it exists and is not a directory");
      return false;
    }
    return true;
  }

  // Removes the folder and the parents create() made, innermost first, while they are empty.
  void remove_if_empty() const {
    namespace fs = std::filesystem;
    if (created_.empty()) return;
    std::error_code ec;
    for (fs::path p = dir_; !p.empty(); p = p.parent_path())
      if (!fs::remove(p, ec) || p == created_ || p == p.parent_path()) return;
  }

 private:
  std::filesystem::path dir_;      // absolute
  std::filesystem::path created_;  // the outermost folder create() made; empty when dir_ existed
};

}  // namespace fp8wire
