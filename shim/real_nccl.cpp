#include "shim/real_nccl.hpp"

#include <dlfcn.h>

#include <filesystem>
#include <string_view>

#include <fmt/format.h>

namespace fp8wire {

// Everything fp8wire calls itself, plus the pass-through of the collectives every job uses. The
// rest may be missing from an older NCCL (CommInitRankConfig/Finalize 2.14, CommSplit 2.18,
// GroupSimulateEnd 2.22, CommInitRankScalable 2.23, CommShrink 2.27, AlltoAll 2.28, GetLastError
// 2.13, the legacy Bcast); an export whose real function is missing returns ncclSystemError.
bool NcclApi::has_required() const {
  return GetVersion && GetUniqueId && GetErrorString && CommInitRank && CommInitAll && CommDestroy &&
         CommAbort && CommGetAsyncError && CommCount && CommCuDevice && CommUserRank && AllReduce &&
         ReduceScatter && AllGather && Broadcast && Reduce && Send && Recv && GroupStart && GroupEnd;
}

}  // namespace fp8wire

namespace fp8wire::shim {
namespace {

const void* own_base() {
  static const void* base = [] {
    Dl_info info{};
    return dladdr(reinterpret_cast<const void*>(&own_base), &info) ? info.dli_fbase : nullptr;
  }();
  return base;
}

std::string object_of(const void* address) {
  Dl_info info{};
  if (address && dladdr(address, &info) && info.dli_fname) return info.dli_fname;
  return "?";
}

// Looks every function up in one source. NCCL exports strong pnccl* and weak nccl* names; the
// pnccl* name is the fallback when the nccl* one is missing or is ours.
template <class Lookup>
NcclApi fill_table(Lookup lookup, std::string& missing) {
  NcclApi api;
  auto find = [&](std::string_view name) -> void* {
    void* p = lookup(std::string(name).c_str());
    if (!p || is_own_address(p)) p = lookup(fmt::format("p{}", name).c_str());
    if (p && is_own_address(p)) p = nullptr;
    return p;
  };
#define FP8WIRE_NCCL_FN(name)                                                   \
  api.name = reinterpret_cast<decltype(api.name)>(find("nccl" #name));         \
  if (!api.name) missing += (missing.empty() ? "nccl" : ", nccl") + std::string(#name);
#include "sched/platform/nccl_functions.def"
#undef FP8WIRE_NCCL_FN
  return api;
}

bool accept(RealNccl& out, NcclApi api, const std::string& missing, std::string origin_kind) {
  if (api.has_required()) {
    out.api = api;
    out.found = true;
    out.origin = fmt::format("{} ({})", origin_kind, object_of(reinterpret_cast<const void*>(api.AllReduce)));
    if (!missing.empty()) out.origin += fmt::format("; missing optional {}", missing);
    return true;
  }
  out.failure += fmt::format("{}: incomplete (missing {}); ", origin_kind, missing);
  return false;
}

}  // namespace

bool is_own_address(const void* address) {
  Dl_info info{};
  return address && dladdr(address, &info) && info.dli_fbase == own_base();
}

bool real_nccl_present(const std::string& explicit_path) {
  const void* next = dlsym(RTLD_NEXT, "ncclAllReduce");
  if (next && !is_own_address(next)) return true;
  for (const char* soname : {"libnccl.so.2", "libnccl.so"}) {
    if (void* handle = dlopen(soname, RTLD_LAZY | RTLD_NOLOAD)) {
      dlclose(handle);  // drops only the reference RTLD_NOLOAD just took
      return true;
    }
  }
  std::error_code ec;
  return !explicit_path.empty() && std::filesystem::is_regular_file(explicit_path, ec);
}

RealNccl resolve_real_nccl(const std::string& explicit_path) {
  RealNccl out;
  {
    std::string missing;
    NcclApi api = fill_table([](const char* name) { return dlsym(RTLD_NEXT, name); }, missing);
    if (api.AllReduce == nullptr && api.GroupStart == nullptr)
      out.failure += "RTLD_NEXT: no NCCL in the global scope; ";
    else if (accept(out, api, missing, "RTLD_NEXT"))
      return out;
  }
  for (const char* soname : {"libnccl.so.2", "libnccl.so"}) {
    // RTLD_NOLOAD only finds a library already in the process; the reference it takes is kept
    // for the life of the process, as NCCL must not be unloaded under us.
    void* handle = dlopen(soname, RTLD_LAZY | RTLD_NOLOAD);
    if (!handle) continue;
    std::string missing;
    NcclApi api = fill_table([handle](const char* name) { return dlsym(handle, name); }, missing);
    if (accept(out, api, missing, fmt::format("already loaded {}", soname))) return out;
  }
  out.failure += "RTLD_NOLOAD: libnccl.so.2 is not loaded; ";
  if (!explicit_path.empty()) {
    void* handle = dlopen(explicit_path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* why = dlerror();
      out.failure += fmt::format("nccl.library '{}': {}; ", explicit_path, why ? why : "dlopen failed");
    } else {
      std::string missing;
      NcclApi api = fill_table([handle](const char* name) { return dlsym(handle, name); }, missing);
      if (accept(out, api, missing, fmt::format("nccl.library {}", explicit_path))) return out;
    }
  } else {
    out.failure += "nccl.library: not set (FP8WIRE_NCCL_LIBRARY)";
  }
  return out;
}

}  // namespace fp8wire::shim
