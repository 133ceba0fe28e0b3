// Writing the profiler's output files so that a failure is never reported as success: the text
// goes to a temporary file beside the target, is flushed and closed with every error checked, and
// only then renamed over the target, so a reader sees the old file or the whole new one (never a
// truncated report), and a path that cannot be written is an error naming it.
#pragma once

#include <string>
#include <string_view>

namespace fp8wire::prof {

// False with `error` = "cannot write '<path>': <reason>". Devices and pipes (/dev/stdout, a FIFO)
// are written directly: they cannot be renamed over.
bool write_file_atomically(const std::string& path, std::string_view text, std::string& error);

}  // namespace fp8wire::prof
