// Finding the real NCCL under libfp8wire.so, once, into a typed table. Tried in order, first
// complete source wins:
//   1. dlsym(RTLD_NEXT): NCCL in the global scope after us (a job linked against libnccl);
//   2. dlopen("libnccl.so.2", RTLD_NOLOAD): NCCL loaded RTLD_LOCAL as a dependency of another
//      library (PyTorch's extension), invisible to RTLD_NEXT;
//   3. dlopen(nccl.library): an explicit path from the configuration.
// All functions of one table come from one source, and no pointer may be one of fp8wire's own
// exports (dladdr check), or a call would loop back into the shim.
#pragma once

#include <string>

#include "sched/engine/engine.hpp"

namespace fp8wire::shim {

struct RealNccl {
  NcclApi api;
  bool found = false;     // api.has_required()
  std::string origin;     // where it came from, for the log: "RTLD_NEXT (/usr/lib/libnccl.so.2)"
  std::string failure;    // why each source was refused, when !found
};

RealNccl resolve_real_nccl(const std::string& explicit_path);

// Whether resolve_real_nccl would have a source to try: NCCL already in the process (sources 1 and
// 2) or nccl.library naming a file. Loads nothing and keeps no reference, for questions asked
// before set-up (fp8wire_active).
bool real_nccl_present(const std::string& explicit_path);

// True when `address` lies inside libfp8wire.so itself.
bool is_own_address(const void* address);

}  // namespace fp8wire::shim
