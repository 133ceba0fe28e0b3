#include "sched/platform/nccl_api.hpp"

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

NcclApi nccl_api_from_lookup(const std::function<void*(const char* name)>& lookup, std::string& missing) {
  NcclApi api;
#define FP8WIRE_NCCL_FN(name)                                                   \
  api.name = reinterpret_cast<decltype(api.name)>(lookup("nccl" #name));       \
  if (!api.name) missing += (missing.empty() ? "nccl" : ", nccl") + std::string(#name);
#include "sched/platform/nccl_functions.def"
#undef FP8WIRE_NCCL_FN
  return api;
}

}  // namespace fp8wire
