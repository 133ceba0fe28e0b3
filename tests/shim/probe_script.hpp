// The calls the shim tests make through libfp8wire.so, and what the fake NCCL must record for
// them. Kept side by side so an argument and its expectation cannot drift apart.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "sched/platform/nccl_api.hpp"

namespace probe {

// Distinctive values: a swapped or dropped argument shows up in the record.
inline void* ptr(uintptr_t v) { return reinterpret_cast<void*>(v); }
inline const uintptr_t kSend = 0x10001000, kRecv = 0x20002000, kStream = 0x30003000;
inline cudaStream_t stream() { return reinterpret_cast<cudaStream_t>(kStream); }
// A real ncclConfig_t (the shim reads its blocking flag); its address differs per process, so the
// probe prints it ("config-at ...") and the expectations take it as a parameter.
inline ncclConfig_t g_config = NCCL_CONFIG_INITIALIZER;
inline ncclConfig_t* config() { return &g_config; }
// The fake hands out communicators 0xc0c00001, 0xc0c00002, ... in creation order.
inline std::string comm(int n) { return fmt::format("{:#x}", 0xc0c00000u + n); }

inline ncclUniqueId unique_id(int first) {
  ncclUniqueId id{};
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; ++i) id.internal[i] = static_cast<char>(first + i);
  return id;
}

using Results = std::vector<std::pair<std::string, ncclResult_t>>;

// Calls every exported function once (the group calls and AllReduce more than once).
inline Results run_all(const fp8wire::NcclApi& api) {
  Results r;
  ncclComm_t c1 = nullptr, c2 = nullptr, all[2] = {}, c5 = nullptr, c6 = nullptr, c7 = nullptr;
  const int devlist[2] = {3, 5};
  ncclUniqueId ids[2] = {unique_id(1), unique_id(0x11)};
  int exclude[2] = {1, 3};
  const void* send = ptr(kSend);
  void* recv = ptr(kRecv);
  r.emplace_back("ncclCommInitRank", api.CommInitRank(&c1, 2, ids[0], 1));
  r.emplace_back("ncclCommInitRankConfig", api.CommInitRankConfig(&c2, 2, ids[0], 0, config()));
  r.emplace_back("ncclCommInitAll", api.CommInitAll(all, 2, devlist));
  r.emplace_back("ncclCommInitRankScalable", api.CommInitRankScalable(&c5, 4, 3, 2, ids, config()));
  r.emplace_back("ncclCommSplit", api.CommSplit(c1, 7, 9, &c6, config()));
  r.emplace_back("ncclCommShrink", api.CommShrink(c1, exclude, 2, &c7, config(), 1));
  r.emplace_back("ncclAllReduce", api.AllReduce(send, recv, 1000, ncclFloat32, ncclSum, c1, stream()));
  r.emplace_back("ncclAllReduce", api.AllReduce(send, recv, 1001, ncclInt32, ncclMax, c1, stream()));
  r.emplace_back("ncclReduceScatter", api.ReduceScatter(send, recv, 250, ncclBfloat16, ncclAvg, c1, stream()));
  r.emplace_back("ncclAllGather", api.AllGather(send, recv, 333, ncclFloat16, c1, stream()));
  r.emplace_back("ncclAlltoAll", api.AlltoAll(send, recv, 399, ncclBfloat16, c1, stream()));
  r.emplace_back("ncclBroadcast", api.Broadcast(send, recv, 444, ncclInt8, 1, c1, stream()));
  r.emplace_back("ncclBcast", api.Bcast(recv, 555, ncclUint64, 0, c1, stream()));
  r.emplace_back("ncclReduce", api.Reduce(send, recv, 666, ncclFloat64, ncclMax, 1, c1, stream()));
  r.emplace_back("ncclGroupStart", api.GroupStart());
  r.emplace_back("ncclSend", api.Send(send, 777, ncclUint8, 1, c1, stream()));
  r.emplace_back("ncclRecv", api.Recv(recv, 888, ncclInt64, 0, c1, stream()));
  r.emplace_back("ncclGroupEnd", api.GroupEnd());
  r.emplace_back("ncclCommFinalize", api.CommFinalize(c6));
  r.emplace_back("ncclCommDestroy", api.CommDestroy(c6));
  r.emplace_back("ncclCommAbort", api.CommAbort(c7));
  r.emplace_back("ncclCommDestroy", api.CommDestroy(c2));
  return r;
}

// What the fake records for run_all, in order.
inline std::vector<std::string> expected_all(const std::string& cf) {
  const std::string s = fmt::format("{:#x}", kSend), v = fmt::format("{:#x}", kRecv);
  const std::string st = fmt::format("{:#x}", kStream);
  const std::string c1 = comm(1);
  auto i = [](auto e) { return static_cast<int>(e); };
  return {
      fmt::format("ncclCommInitRank(nranks=2, id=0102030405060708, rank=1) -> {}", c1),
      fmt::format("ncclCommInitRankConfig(nranks=2, id=0102030405060708, rank=0, config={}) -> {}", cf, comm(2)),
      fmt::format("ncclCommInitAll(ndev=2, devlist=[3,5]) -> [{},{}]", comm(3), comm(4)),
      fmt::format("ncclCommInitRankScalable(nranks=4, myrank=3, nId=2, ids=[0102030405060708,1112131415161718], "
                  "config={}) -> {}", cf, comm(5)),
      fmt::format("ncclCommSplit(comm={}, color=7, key=9, config={}) -> {}", c1, cf, comm(6)),
      fmt::format("ncclCommShrink(comm={}, exclude=[1,3], count=2, config={}, flags=1) -> {}", c1, cf, comm(7)),
      fmt::format("ncclAllReduce(send={}, recv={}, count=1000, dtype={}, op={}, comm={}, stream={}) depth=0", s, v,
                  i(ncclFloat32), i(ncclSum), c1, st),
      fmt::format("ncclAllReduce(send={}, recv={}, count=1001, dtype={}, op={}, comm={}, stream={}) depth=0", s, v,
                  i(ncclInt32), i(ncclMax), c1, st),
      fmt::format("ncclReduceScatter(send={}, recv={}, recvcount=250, dtype={}, op={}, comm={}, stream={})", s, v,
                  i(ncclBfloat16), i(ncclAvg), c1, st),
      fmt::format("ncclAllGather(send={}, recv={}, sendcount=333, dtype={}, comm={}, stream={})", s, v,
                  i(ncclFloat16), c1, st),
      fmt::format("ncclAlltoAll(send={}, recv={}, count=399, dtype={}, comm={}, stream={})", s, v, i(ncclBfloat16),
                  c1, st),
      fmt::format("ncclBroadcast(send={}, recv={}, count=444, dtype={}, root=1, comm={}, stream={})", s, v,
                  i(ncclInt8), c1, st),
      fmt::format("ncclBcast(buff={}, count=555, dtype={}, root=0, comm={}, stream={})", v, i(ncclUint64), c1, st),
      fmt::format("ncclReduce(send={}, recv={}, count=666, dtype={}, op={}, root=1, comm={}, stream={})", s, v,
                  i(ncclFloat64), i(ncclMax), c1, st),
      "ncclGroupStart()",
      fmt::format("ncclSend(send={}, count=777, dtype={}, peer=1, comm={}, stream={})", s, i(ncclUint8), c1, st),
      fmt::format("ncclRecv(recv={}, count=888, dtype={}, peer=0, comm={}, stream={})", v, i(ncclInt64), c1, st),
      "ncclGroupEnd()",
      fmt::format("ncclCommFinalize(comm={})", comm(6)),
      fmt::format("ncclCommDestroy(comm={})", comm(6)),
      fmt::format("ncclCommAbort(comm={})", comm(7)),
      fmt::format("ncclCommDestroy(comm={})", comm(2)),
  };
}

}  // namespace probe
