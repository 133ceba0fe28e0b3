// Sizes, element types and the byte arithmetic of a sweep, in plain C++ (tested in CI without a GPU).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/config.hpp"
#include "sched/engine/accounting.hpp"

namespace fp8wire::bench {

// "4KiB", "64MiB", "1GiB", "1.5MiB", "4096", "4K" (K/M/G mean KiB/MiB/GiB, as in config.hpp).
// Returns nullopt for anything else, including a fractional byte count and overflow.
std::optional<uint64_t> parse_bytes(std::string_view text);
// Exact binary unit when the value is a whole number of it ("64 MiB"), else one decimal ("1.5 MiB"),
// else plain bytes ("1000 B").
std::string format_bytes(uint64_t bytes);

// Geometric series min, min*step, ... up to max inclusive (nccl-tests -b/-e/-f), each rounded down
// to a multiple of `granule` (a size must split evenly into ranks x elements). Duplicates after
// rounding are dropped; sizes rounding to 0 are skipped. step must be > 1.
std::vector<uint64_t> size_series(uint64_t min_bytes, uint64_t max_bytes, double step, uint64_t granule);

enum class DType : uint8_t { bf16, f16, f32 };
inline constexpr size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }
const char* to_string(DType);
std::optional<DType> parse_dtype(std::string_view);  // "bf16" | "fp16"/"f16" | "fp32"/"f32"

// Every collective a sweep can time, in the order `--collectives all` times them.
inline constexpr Collective kCollectives[] = {Collective::all_reduce, Collective::reduce_scatter, Collective::all_gather,
                                              Collective::all_to_all, Collective::send_recv};
// "all_reduce"/"allreduce"/"ar", ..., "all_to_all"/"a2a", "send_recv"/"sendrecv"/"p2p"
std::optional<Collective> parse_collective(std::string_view);
std::optional<Fabric> parse_fabric(std::string_view);          // "nvlink" | "pcie" | "net"

// Bus-bandwidth factor of nccl-tests (its doc/PERFORMANCE.md): busbw = algbw * factor, where algbw =
// bytes / time and bytes is the full-buffer size nccl-tests reports (all-reduce: the buffer;
// reduce-scatter: the input, n x the output; all-gather: the output, n x the input; all-to-all: the
// send buffer, n chunks, its factor (n-1)/n as alltoall_perf's; send/recv: one message, factor 1 as
// sendrecv_perf's).
double busbw_factor(Collective c, int nranks);
// GB/s (1e9 bytes per second) from bytes and microseconds.
double algbw_gbps(uint64_t bytes, double time_us);

// Per-rank element counts of a full-buffer size: what each NCCL call is passed.
struct CallCounts {
  uint64_t send_elems;  // elements in each rank's send buffer
  uint64_t recv_elems;  // elements in each rank's receive buffer
  uint64_t count_arg;   // the count argument of the NCCL call (recvcount for RS, sendcount for AG, per peer for A2A)
};
CallCounts call_counts(Collective c, uint64_t full_bytes, DType t, int nranks);

// Names as written in profiles, JSON and tables ("all_reduce", "pcie", "two_shot"). Local to the
// benchmark so its host library needs nothing beyond headers from common/ and sched/.
const char* collective_name(Collective c);
const char* fabric_name(Fabric f);
const char* path_name(Path p);
std::optional<Path> parse_path(std::string_view);  // "passthrough"/"nccl", "two_shot", "one_shot", "ring"
// Names of config.hpp's gather_transport values ("auto", "allgather", "sendrecv"), spelled here
// because the host library links nothing from common/.
const char* gather_transport_name(GatherMethod t);
std::optional<GatherMethod> parse_gather_transport(std::string_view);
// `sweep --gather-transport`: the transports every path with a gather step is timed with. "auto":
// none forced (empty: the configuration as loaded); "allgather" or "sendrecv": that one; "both":
// allgather, then sendrecv (each such path timed twice per size). nullopt for anything else.
std::optional<std::vector<GatherMethod>> parse_gather_transport_option(std::string_view);
// The option's value for such a list: "auto", "allgather", "sendrecv" or "both".
std::string gather_transport_option_name(const std::vector<GatherMethod>& transports);

// has_gather_step(collective, path): sched/engine/accounting.hpp, shared with the planner.

// The FP8 paths worth timing for a collective, given the requested ones (in the requested order):
// all-reduce has three algorithms; reduce-scatter, all-gather and all-to-all one each (sched/plan/
// types.hpp only_fp8_path: two_shot, one_shot, one_shot), so any FP8 request maps to it.
// passthrough is always first.
std::vector<Path> paths_for(Collective c, const std::vector<Path>& requested);

// Splits "a,b,c" (empty items dropped).
std::vector<std::string> split_list(std::string_view text);

}  // namespace fp8wire::bench
