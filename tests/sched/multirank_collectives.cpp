// GPU tier of the scheduler: N ranks on GPU 0 (started by the shared rank launcher, each with its own
// NCCL_HOSTID, so NCCL treats them as separate hosts over sockets) drive sched::Engine through a linked NCCL.
//
// Checked per case, and printed as a correctness matrix:
//   * error against an fp64 reference, within the bound of the wire format (below);
//   * all-reduce / all-gather: every rank's output bitwise identical (hashes compared by the parent);
//   * pass-through: bitwise identical to plain NCCL; ineligible calls exact;
//   * groups (nested, mixed with the application's send/recv and pass-through calls) and coalescing;
//   * pipelining: a small scratch pool gives bitwise the same result as one stage;
//   * CUDA graph capture: replays with new inputs equal eager runs bitwise;
//   * error feedback: the mean of repeated all-reduces converges; a cap below the buffer disables it;
//   * all-to-all (equal splits, the application's ncclAlltoAll): one quantization of each chunk sent,
//     the rank's own chunk exact, pass-through bit for bit NCCL's own, inside a group too.
//
// Error bound (e4m3, block scale s = amax/448): one quantization moves an element by at most half an
// ulp of the top binade, 16/448 = 1/28 of its block's amax. An all-reduce that quantizes q times
// (one-shot 1, two-shot 2, ring N) is therefore within q/28 * sum_r amax_r of the exact sum, plus
// the output dtype's rounding (2^-8 relative for bf16, 2^-11 fp16, 2^-24 fp32) of the result.
// The test reports err / bound and fails above 1.
//
// Usage: multirank_collectives [--ranks 2,3,4] [--big] [--timeout S] [--per-gpu] [--direct peer_memory|host_memory]
//                              [--direct-protocol kernels|copy_engine] [--direct-sets K]
//   The direct settings are the library's defaults unless named: --direct-protocol, --direct-sets set
//   direct.protocol (host memory's protocol; peer memory runs kernels either way) and direct.sets.
//   --per-gpu: rank r runs on GPU r % (visible GPUs) with no NCCL_HOSTID, so NCCL joins real GPUs by
//   its own transports (NVLink/P2P, or host memory under NCCL_P2P_DISABLE=1) instead of sockets.
//   --big: the big all-reduce case moves 256 MiB (64 Mi fp32) instead of 64 MiB, at the first world
//   size listed only (it is the slowest case; one world size shows the pipeline at full size).
// Exit 77 with "SKIPPED: no CUDA device" where no GPU is visible.
#include <cuda_runtime.h>
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/rank_launcher.hpp"
#include "common/status.hpp"
#include "quant/reference.hpp"
#include "sched/engine/accounting.hpp"
#include "sched/engine/engine.hpp"
#include "sched/engine/engine_probe.hpp"
#include "sched/platform/gpu_platform.hpp"
#include "sched/platform/nccl_api_linked.hpp"
#include "sched/plan/plan.hpp"
#include "tests/sched/multirank_main.hpp"

using namespace fp8wire;
using fp8wire::quant::ElemType;

namespace {


constexpr uint64_t kFnvSeed = 1469598103934665603ull;
uint64_t fnv(const void* p, size_t n, uint64_t h = kFnvSeed) { return sched::fnv1a(p, n, h); }

uint32_t mix32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// Magnitude of the 128-element block `block` (global index / 128): 2^-10..2^9, zero now and then
// (an all-zero block has scale 0).
double block_magnitude(size_t block, uint32_t seed) {
  if (block % 61 == 7) return 0.0;
  return std::ldexp(1.0, static_cast<int>((block * 7 + seed) % 20) - 10);
}

// Input of rank r, element i: uniform in [-1, 1] times its block's magnitude.
float input_value(int rank, size_t i, uint32_t seed) {
  const float u = static_cast<float>(mix32((static_cast<uint64_t>(seed) << 48) ^ (static_cast<uint64_t>(rank) << 40) ^ i)) / 4294967296.0f;
  return (2.0f * u - 1.0f) * static_cast<float>(block_magnitude(i / 128, seed));
}

struct TypeInfo {
  ncclDataType_t nccl;
  ElemType elem;
  const char* name;
  double out_eps;
};
const TypeInfo kTypes[] = {{ncclFloat32, ElemType::f32, "f32", 0x1p-24},
                           {ncclFloat16, ElemType::f16, "f16", 0x1p-11},
                           {ncclBfloat16, ElemType::bf16, "bf16", 0x1p-8}};

// A host buffer in a caller dtype.
struct HostBuf {
  ElemType type;
  size_t count;
  std::vector<unsigned char> bytes;
  HostBuf(ElemType t, size_t n) : type(t), count(n), bytes(n * quant::elem_size(t)) {}
  float get(size_t i) const { return quant::ref::load_elem(bytes.data(), type, i); }
  void set(size_t i, float v) { quant::ref::store_elem(bytes.data(), type, i, v); }
};

struct Rank {
  int rank = 0, n = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  NcclApi api;
  Platform platform;  // the GPU platform over `api`
  FILE* out = nullptr;
  bool big = false;
  std::string tag;   // prefix of every case name ("sr/" for the send/recv gather pass)
};

// The gather transport test_config() gives engines: the whole matrix runs once with the
// all-gather and once with the send/recv gather (Config::gather_transport).
GatherMethod g_gather = GatherMethod::allgather;
// --ranks-per-host R: fp8wire's host map forced to blocks of R ranks (hierarchy.ranks_per_host), and
// the hierarchical path among the cases (only the step between "hosts" quantized).
int g_ranks_per_host = 0;
// --direct peer_memory|host_memory: every FP8 call the direct transport can carry goes over it (the
// ranks share this machine's GPU, so direct.assume_one_host), and a case checks that they did.
DirectMode g_direct = DirectMode::off;
DirectProtocol g_protocol = DirectProtocol::automatic;  // --direct-protocol P: direct.protocol
uint32_t g_sets = Config{}.direct_sets;  // --direct-sets K: direct.sets

void report(Rank& R, const std::string& name, bool ok, double ratio, uint64_t hash, bool identical_required) {
  fprintf(R.out, "%s%s %s %.4f %016llx %d\n", R.tag.c_str(), name.c_str(), ok ? "PASS" : "FAIL", ratio,
          static_cast<unsigned long long>(hash), identical_required ? 1 : 0);
  fflush(R.out);
}

// Host -> device copy that is complete when it returns. A plain cudaMemcpy from pageable memory
// may return before its DMA lands, and it runs on the legacy stream, which the non-blocking rank
// stream does not wait for: the next kernel on the rank stream could read stale bytes (seen as a
// wrong in-place all-gather and a "pipelined != single stage" mismatch at 4 ranks, where four
// processes share the copy engines).
void upload(void* dev, const void* host, size_t bytes) {
  FP8WIRE_CUDA_OR(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice), _exit(3));
  FP8WIRE_CUDA_OR(cudaDeviceSynchronize(), _exit(3));
}

// Fills a device buffer with rank r's input for `count` elements.
void make_input(int rank, size_t count, const TypeInfo& t, uint32_t seed, void* dev) {
  HostBuf h(t.elem, count);
  for (size_t i = 0; i < count; ++i) h.set(i, input_value(rank, i, seed));
  upload(dev, h.bytes.data(), h.bytes.size());
}

// Element i of rank r's input, rounded to the dtype as the device sees it.
double rounded_input(int rank, size_t i, uint32_t seed, const TypeInfo& t) {
  unsigned char one[4];
  quant::ref::store_elem(one, t.elem, 0, input_value(rank, i, seed));
  return quant::ref::load_elem(one, t.elem, 0);
}

struct ErrStats {
  double worst_ratio = 0;
  bool finite = true;
};

// Compares out[i] (every `stride`-th) with the exact sum over ranks of the inputs at index map(i);
// q quantizations; `scale` 1/N for avg.
// By default the quantization blocks are the generator's blocks (global index / 128), whose shared
// magnitude bounds every rank's block amax; `block_amax(i)` overrides that where blocks differ.
// Largest magnitude over the generator blocks that the global range [first, last] touches.
double range_magnitude(size_t first, size_t last, uint32_t seed) {
  double m = 0;
  for (size_t b = first / 128; b <= last / 128; ++b) m = std::max(m, block_magnitude(b, seed));
  return m;
}

template <typename IndexMap>
ErrStats check_sum(const HostBuf& out, size_t stride, int nranks, uint32_t seed, const TypeInfo& t,
                   int q, double scale, IndexMap map);

template <typename IndexMap, typename AmaxFn>
ErrStats check_sum(const HostBuf& out, size_t stride, int nranks, uint32_t seed, const TypeInfo& t,
                   int q, double scale, IndexMap map, AmaxFn block_amax) {
  ErrStats s;
  for (size_t i = 0; i < out.count; i += stride) {
    const size_t src = map(i);
    double exact = 0;
    for (int r = 0; r < nranks; ++r) exact += rounded_input(r, src, seed, t);
    const double amax_sum = nranks * block_amax(i);
    exact *= scale;
    const double bound = q / 28.0 * amax_sum * scale * 1.0001 + std::abs(exact) * t.out_eps * 1.01 + 1e-30;
    const double got = out.get(i);
    if (!std::isfinite(got)) {
      s.finite = false;
      s.worst_ratio = 1e9;
      continue;
    }
    s.worst_ratio = std::max(s.worst_ratio, std::abs(got - exact) / bound);
  }
  return s;
}

// Quantization blocks = the generator's blocks (all-reduce: shards and stages are whole blocks).
template <typename IndexMap>
ErrStats check_sum(const HostBuf& out, size_t stride, int nranks, uint32_t seed, const TypeInfo& t,
                   int q, double scale, IndexMap map) {
  return check_sum(out, stride, nranks, seed, t, q, scale, map,
                   [&](size_t i) { return block_magnitude(map(i) / 128, seed); });
}

HostBuf download(const void* dev, const TypeInfo& t, size_t count) {
  HostBuf h(t.elem, count);
  FP8WIRE_CUDA_OR(cudaMemcpy(h.bytes.data(), dev, h.bytes.size(), cudaMemcpyDeviceToHost), _exit(3));
  return h;
}

Config test_config() {
  Config c;
  for (auto& per : c.thresholds) per = {0, 0, 0};
  c.collective_enable.fill(true);
  c.gather_transport = g_gather;
  c.hierarchy_ranks_per_host = static_cast<uint32_t>(g_ranks_per_host);
  c.direct_transport = g_direct;
  c.direct_assume_one_host = g_direct != DirectMode::off;
  c.direct_protocol = g_protocol;
  c.direct_sets = g_sets;
  return c;
}

// With --direct: the calls this process made over the direct transport, against the FP8 calls it
// could carry (one-shot, two-shot, reduce-scatter, all-gather, all-to-all; not the ring or the fallbacks).
void report_direct_usage(Rank& R) {
  if (g_direct == DirectMode::off) return;
  const Carrier want = g_direct == DirectMode::peer_memory ? Carrier::peer_memory : Carrier::host_memory;
  std::vector<CallRecord> records(Accounting::kCapacity);
  const size_t got = Accounting::instance().snapshot(records.data(), records.size(), 0);
  size_t carried = 0, eligible = 0;
  for (size_t i = 0; i < got; ++i) {
    const CallRecord& c = records[i];
    if (!is_fp8(c.path) || c.path == Path::ring || c.path == Path::hierarchical) continue;
    ++eligible;
    carried += c.transport == want;
  }
  char name[160];
  snprintf(name, sizeof(name), "direct/%s-carried-%zu-of-%zu-fp8-calls", to_string(want), carried, eligible);
  // Calls too large for one buffer set of the window go over NCCL by design: the big cases.
  report(R, name, eligible > 0 && carried * 10 >= eligible * 9, 0, 0, false);
}

void run_all_reduce_cases(Rank& R, sched::Engine& eng) {
  const std::vector<size_t> sizes = {1, 127, 1000, 65537, (size_t{1} << 20) + 3};
  for (const TypeInfo& t : kTypes) {
    for (ncclRedOp_t op : {ncclSum, ncclAvg}) {
      for (Path path : {Path::two_shot, Path::one_shot, Path::ring, Path::hierarchical}) {
        if (path == Path::hierarchical && g_ranks_per_host <= 1) continue;
        for (size_t si = 0; si < sizes.size(); ++si) {
          const size_t count = sizes[si];
          const bool inplace = (si + static_cast<size_t>(op)) % 2 == 1;
          const uint32_t seed = static_cast<uint32_t>(si * 31 + static_cast<int>(path) * 7 + static_cast<int>(t.elem));
          const size_t bytes = count * quant::elem_size(t.elem);
          void *in = nullptr, *out = nullptr;
          FP8WIRE_CUDA_OR(cudaMalloc(&in, bytes), _exit(3));
          FP8WIRE_CUDA_OR(cudaMalloc(&out, bytes), _exit(3));
          make_input(R.rank, count, t, seed, in);
          const ncclResult_t res = sched::EngineProbe(eng).all_reduce_forced(path, in, inplace ? in : out, count, t.nccl, op, R.comm, R.stream);
          FP8WIRE_CUDA_OR(cudaStreamSynchronize(R.stream), _exit(3));
          const HostBuf h = download(inplace ? in : out, t, count);
          // Quantizations: one-shot 1, two-shot 2, ring N; hierarchical at most 2 (two-shot between
          // hosts), of host sums whose amax is at most the sum of the inputs' amax.
          const int q = path == Path::one_shot ? 1 : path == Path::two_shot || path == Path::hierarchical ? 2 : R.n;
          // Every element up to 64 Ki, a sample of the larger buffers (the hashes cover every byte).
          const size_t stride = count > 70000 ? 7 : 1;
          const ErrStats e = check_sum(h, stride, R.n, seed, t, q, op == ncclAvg ? 1.0 / R.n : 1.0,
                                       [](size_t i) { return i; });
          char name[160];
          snprintf(name, sizeof(name), "ar/%s/%s/%s/%zu/%s", t.name, op == ncclSum ? "sum" : "avg",
                   to_string(path), count, inplace ? "inplace" : "oop");
          report(R, name, res == ncclSuccess && e.finite && e.worst_ratio <= 1.0, e.worst_ratio,
                 fnv(h.bytes.data(), h.bytes.size()), true);
          cudaFree(in);
          cudaFree(out);
        }
      }
    }
  }
}

// Big buffers: 64 MiB of fp32 (256 MiB with --big), pipelined by pipeline.chunk_bytes; sampled.
void run_big_cases(Rank& R, sched::Engine& eng) {
  const TypeInfo& t = kTypes[0];
  const size_t count = R.big ? (size_t{64} << 20) : (size_t{16} << 20);
  for (Path path : {Path::two_shot, Path::one_shot}) {
    const uint32_t seed = 99 + static_cast<uint32_t>(path);
    void* buf = nullptr;
    FP8WIRE_CUDA_OR(cudaMalloc(&buf, count * 4), _exit(3));
    make_input(R.rank, count, t, seed, buf);
    const ncclResult_t res = sched::EngineProbe(eng).all_reduce_forced(path, buf, buf, count, t.nccl, ncclSum, R.comm, R.stream);
    FP8WIRE_CUDA_OR(cudaStreamSynchronize(R.stream), _exit(3));
    const HostBuf h = download(buf, t, count);
    const ErrStats e = check_sum(h, 4099, R.n, seed, t, path == Path::one_shot ? 1 : 2, 1.0, [](size_t i) { return i; });
    char name[160];
    snprintf(name, sizeof(name), "ar/f32/sum/%s/%zu/inplace-big", to_string(path), count);
    report(R, name, res == ncclSuccess && e.finite && e.worst_ratio <= 1.0, e.worst_ratio,
           fnv(h.bytes.data(), h.bytes.size()), true);
    cudaFree(buf);
  }
}

void run_reduce_scatter_cases(Rank& R, sched::Engine& eng) {
  for (const TypeInfo& t : kTypes) {
    for (ncclRedOp_t op : {ncclSum, ncclAvg}) {
     for (Path path : {Path::two_shot, Path::hierarchical}) {
      if (path == Path::hierarchical && g_ranks_per_host <= 1) continue;
      for (size_t recvcount : {size_t{1}, size_t{300}, size_t{65536}}) {
        const bool inplace = recvcount == 300;
        const uint32_t seed = static_cast<uint32_t>(recvcount % 1000 + 5);
        const size_t total = recvcount * R.n;
        const size_t es = quant::elem_size(t.elem);
        void *in = nullptr, *out = nullptr;
        FP8WIRE_CUDA_OR(cudaMalloc(&in, total * es), _exit(3));
        FP8WIRE_CUDA_OR(cudaMalloc(&out, recvcount * es), _exit(3));
        make_input(R.rank, total, t, seed, in);
        void* dst = inplace ? static_cast<char*>(in) + R.rank * recvcount * es : out;
        const ncclResult_t res = sched::EngineProbe(eng).reduce_scatter_forced(path, in, dst, recvcount, t.nccl, op, R.comm, R.stream);
        FP8WIRE_CUDA_OR(cudaStreamSynchronize(R.stream), _exit(3));
        const HostBuf h = download(dst, t, recvcount);
        const size_t base = R.rank * recvcount;
        // One quantization of every input; the sum is written in the caller dtype directly. Each
        // slot is quantized as its own chunk, so a quantization block starts at the slot's start
        // and may touch two of the generator's blocks.
        auto amax = [&](size_t i) {
          const size_t first = base + i / 128 * 128;
          return range_magnitude(first, std::min(base + recvcount, first + 128) - 1, seed);
        };
        const ErrStats e = check_sum(h, 1, R.n, seed, t, 1, op == ncclAvg ? 1.0 / R.n : 1.0,
                                     [base](size_t i) { return base + i; }, amax);
        char name[160];
        snprintf(name, sizeof(name), "rs/%s/%s/%s/%zu/%s", t.name, op == ncclSum ? "sum" : "avg", to_string(path), recvcount,
                 inplace ? "inplace" : "oop");
        report(R, name, res == ncclSuccess && e.finite && e.worst_ratio <= 1.0, e.worst_ratio, 0, false);
        cudaFree(in);
        cudaFree(out);
      }
     }
    }
  }
}

void run_all_gather_cases(Rank& R, sched::Engine& eng) {
  for (const TypeInfo& t : kTypes) {
    for (size_t sendcount : {size_t{1}, size_t{200}, size_t{4096}, size_t{100003}}) {
      const bool inplace = sendcount == 200 || sendcount == 4096;
      const uint32_t seed = static_cast<uint32_t>(sendcount % 1000 + 11);
      const size_t es = quant::elem_size(t.elem);
      const size_t total = sendcount * R.n;
      void *in = nullptr, *out = nullptr;
      FP8WIRE_CUDA_OR(cudaMalloc(&in, sendcount * es), _exit(3));
      FP8WIRE_CUDA_OR(cudaMalloc(&out, total * es), _exit(3));
      // Rank r's contribution is input(r, r*sendcount + i) at index r*sendcount + i of the result.
      HostBuf h_in(t.elem, sendcount);
      for (size_t i = 0; i < sendcount; ++i) h_in.set(i, input_value(R.rank, R.rank * sendcount + i, seed));
      void* src = inplace ? static_cast<char*>(out) + R.rank * sendcount * es : in;
      upload(src, h_in.bytes.data(), h_in.bytes.size());
      const ncclResult_t res = sched::EngineProbe(eng).all_gather_forced(Path::one_shot, src, out, sendcount, t.nccl, R.comm, R.stream);
      FP8WIRE_CUDA_OR(cudaStreamSynchronize(R.stream), _exit(3));
      const HostBuf h = download(out, t, total);
      double worst = 0;
      bool finite = true;
      for (size_t i = 0; i < total; ++i) {
        const int owner = static_cast<int>(i / sendcount);
        const double x = rounded_input(owner, i, seed, t);
        // The quantization block is a block of the owner's slot; it spans at most two generator
        // blocks, so the larger of their magnitudes bounds its amax.
        const size_t slot_block_begin = owner * sendcount + (i % sendcount) / 128 * 128;
        const size_t slot_block_last = std::min(owner * sendcount + sendcount, slot_block_begin + 128) - 1;
        const double amax = range_magnitude(slot_block_begin, slot_block_last, seed);
        const double got = h.get(i);
        if (!std::isfinite(got)) finite = false;
        const double bound = amax / 28.0 * 1.0001 + std::abs(x) * t.out_eps * 1.01 + 1e-30;
        if (std::abs(got - x) > bound && worst <= 1.0)  // the first bad element, for diagnosis
          fprintf(stderr, "rank %d ag/%s/%zu: element %zu (slot of rank %d, offset %zu) = %g, expected %g\n",
                  R.rank, t.name, sendcount, i, owner, i % sendcount, got, x);
        worst = std::max(worst, std::abs(got - x) / bound);
      }
      char name[160];
      snprintf(name, sizeof(name), "ag/%s/-/one_shot/%zu/%s", t.name, sendcount, inplace ? "inplace" : "oop");
      report(R, name, res == ncclSuccess && finite && worst <= 1.0, worst, fnv(h.bytes.data(), h.bytes.size()), true);
      cudaFree(in);
      cudaFree(out);
    }
  }
}

// All-to-all, equal splits: rank r's send buffer holds input(r, i) at i (chunk j, for rank j, at
// j * count); it receives chunk j from rank j, so its output at j * count + k is input(j, r * count + k),
// quantized once in blocks of that chunk's own (a block may touch two generator blocks), and its own
// chunk (j == r) exactly. Checks every element, the FP8 record and its wire bytes.
void run_all_to_all_cases(Rank& R, sched::Engine& eng) {
  for (const TypeInfo& t : kTypes) {
    for (size_t count : {size_t{1}, size_t{300}, size_t{4096}, size_t{100003}}) {
      const bool inplace = count == 300;
      const uint32_t seed = static_cast<uint32_t>(count % 1000 + 23);
      const size_t es = quant::elem_size(t.elem);
      const size_t total = count * R.n;
      void *in = nullptr, *out = nullptr;
      FP8WIRE_CUDA_OR(cudaMalloc(&in, total * es), _exit(3));
      FP8WIRE_CUDA_OR(cudaMalloc(&out, total * es), _exit(3));
      make_input(R.rank, total, t, seed, in);
      void* dst = inplace ? in : out;
      const uint64_t before = Accounting::instance().next_seq();
      const ncclResult_t res =
          sched::EngineProbe(eng).all_to_all_forced(Path::one_shot, in, dst, count, t.nccl, R.comm, R.stream);
      FP8WIRE_CUDA_OR(cudaStreamSynchronize(R.stream), _exit(3));
      const HostBuf h = download(dst, t, total);
      double worst = 0;
      bool finite = true, own_exact = true;
      const size_t first = static_cast<size_t>(R.rank) * count;  // of every sender's buffer, the chunk sent here
      for (size_t i = 0; i < total; ++i) {
        const int from = static_cast<int>(i / count);
        const size_t k = i % count;
        const double x = rounded_input(from, first + k, seed, t);
        const double got = h.get(i);
        if (!std::isfinite(got)) finite = false;
        if (from == R.rank) {
          own_exact &= got == x;
          continue;
        }
        const size_t block_begin = first + k / 128 * 128;
        const double amax = range_magnitude(block_begin, std::min(first + count, block_begin + 128) - 1, seed);
        const double bound = amax / 28.0 * 1.0001 + std::abs(x) * t.out_eps * 1.01 + 1e-30;
        worst = std::max(worst, std::abs(got - x) / bound);
      }
      std::vector<CallRecord> rec(4);
      const size_t nrec = Accounting::instance().snapshot(rec.data(), rec.size(), before);
      const bool fp8 = nrec == 1 && rec[0].kind == CallKind::all_to_all && rec[0].path == Path::one_shot &&
                       rec[0].wire_bytes < count * es * static_cast<size_t>(R.n - 1) * 6 / 10 + 1024;
      char name[160];
      snprintf(name, sizeof(name), "a2a/%s/-/one_shot/%zu/%s", t.name, count, inplace ? "inplace" : "oop");
      report(R, name, res == ncclSuccess && finite && worst <= 1.0, worst, 0, false);
      snprintf(name, sizeof(name), "a2a/%s/%zu/own-chunk-exact+fp8-record", t.name, count);
      report(R, name, res == ncclSuccess && own_exact && fp8, 0, 0, false);
      cudaFree(in);
      cudaFree(out);
    }
  }
  // Pass-through: the engine's plain call is NCCL's own all-to-all, bit for bit; an int32 one planned
  // through the engine stays exact.
  const TypeInfo& t = kTypes[2];
  const size_t count = 50000, total = count * R.n;
  void *in = nullptr, *a = nullptr, *b = nullptr;
  FP8WIRE_CUDA_OR(cudaMalloc(&in, total * 2), _exit(3));
  FP8WIRE_CUDA_OR(cudaMalloc(&a, total * 2), _exit(3));
  FP8WIRE_CUDA_OR(cudaMalloc(&b, total * 2), _exit(3));
  make_input(R.rank, total, t, 4, in);
  FP8WIRE_NCCL_OR(sched::EngineProbe(eng).all_to_all_forced(Path::passthrough, in, a, count, t.nccl, R.comm, R.stream), _exit(4));
  FP8WIRE_NCCL_OR(ncclAlltoAll(in, b, count, t.nccl, R.comm, R.stream), _exit(4));
  FP8WIRE_CUDA_OR(cudaStreamSynchronize(R.stream), _exit(3));
  const HostBuf ha = download(a, t, total), hb = download(b, t, total);
  report(R, "passthrough/a2a/bf16==nccl", ha.bytes == hb.bytes, 0, 0, false);
  const size_t ints = count / 2;  // int32 per peer, in the same buffers
  std::vector<int32_t> hi(ints * R.n), ho(ints * R.n);
  for (size_t i = 0; i < hi.size(); ++i) hi[i] = static_cast<int32_t>(R.rank * 1000000 + i);
  upload(in, hi.data(), hi.size() * 4);
  FP8WIRE_NCCL_OR(eng.all_to_all(in, a, ints, ncclInt32, R.comm, R.stream), _exit(4));
  FP8WIRE_CUDA_OR(cudaStreamSynchronize(R.stream), _exit(3));
  FP8WIRE_CUDA_OR(cudaMemcpy(ho.data(), a, ho.size() * 4, cudaMemcpyDeviceToHost), _exit(3));
  bool ok = true;
  for (size_t i = 0; i < ho.size(); ++i) {
    const size_t from = i / ints, k = i % ints;
    ok &= ho[i] == static_cast<int32_t>(from * 1000000 + R.rank * ints + k);
  }
  report(R, "passthrough/a2a/int32-exact", ok, 0, 0, false);
  // Inside an application group with an FP8 all-reduce: each within its bound, the all-reduce's alike.
  const size_t ar_count = 70016;
  void* ar = nullptr;
  FP8WIRE_CUDA_OR(cudaMalloc(&ar, ar_count * 2), _exit(3));
  make_input(R.rank, ar_count, t, 61, ar);
  make_input(R.rank, total, t, 62, in);
  FP8WIRE_NCCL_OR(eng.group_start(), _exit(4));
  FP8WIRE_NCCL_OR(sched::EngineProbe(eng).all_reduce_forced(Path::two_shot, ar, ar, ar_count, t.nccl, ncclSum, R.comm, R.stream), _exit(4));
  FP8WIRE_NCCL_OR(sched::EngineProbe(eng).all_to_all_forced(Path::one_shot, in, b, count, t.nccl, R.comm, R.stream), _exit(4));
  FP8WIRE_NCCL_OR(eng.group_end(), _exit(4));
  FP8WIRE_CUDA_OR(cudaStreamSynchronize(R.stream), _exit(3));
  const HostBuf har = download(ar, t, ar_count), hg = download(b, t, total);
  const ErrStats e = check_sum(har, 1, R.n, 61, t, 2, 1.0, [](size_t i) { return i; });
  double worst = 0;
  for (size_t i = 0; i < total; ++i) {
    const int from = static_cast<int>(i / count);
    const size_t k = i % count, src = static_cast<size_t>(R.rank) * count + k;
    const double x = rounded_input(from, src, 62, t);
    const size_t block_begin = static_cast<size_t>(R.rank) * count + k / 128 * 128;
    const double amax = range_magnitude(block_begin, std::min(static_cast<size_t>(R.rank + 1) * count, block_begin + 128) - 1, 62);
    const double bound = from == R.rank ? 1e-30 : amax / 28.0 * 1.0001 + std::abs(x) * t.out_eps * 1.01 + 1e-30;
    worst = std::max(worst, std::abs(hg.get(i) - x) / bound);
  }
  report(R, "group/all-reduce+a2a/ar-within-bound", e.finite && e.worst_ratio <= 1.0, e.worst_ratio,
         fnv(har.bytes.data(), har.bytes.size()), true);
  report(R, "group/all-reduce+a2a/a2a-within-bound", worst <= 1.0, worst, 0, false);
  cudaFree(ar);
  cudaFree(in);
  cudaFree(a);
  cudaFree(b);
}

// Pass-through through the engine is plain NCCL, bit for bit; ineligible calls stay exact.
void run_passthrough_cases(Rank& R, sched::Engine& eng) {
  for (const TypeInfo& t : kTypes) {
    const size_t count = 100000;
    const size_t bytes = count * quant::elem_size(t.elem);
    void *in = nullptr, *a = nullptr, *b = nullptr;
    FP8WIRE_CUDA_OR(cudaMalloc(&in, bytes), _exit(3));
    FP8WIRE_CUDA_OR(cudaMalloc(&a, bytes), _exit(3));
    FP8WIRE_CUDA_OR(cudaMalloc(&b, bytes), _exit(3));
    make_input(R.rank, count, t, 3, in);
    FP8WIRE_NCCL_OR(sched::EngineProbe(eng).all_reduce_forced(Path::passthrough, in, a, count, t.nccl, ncclSum, R.comm, R.stream), _exit(4));
    FP8WIRE_NCCL_OR(ncclAllReduce(in, b, count, t.nccl, ncclSum, R.comm, R.stream), _exit(4));
    FP8WIRE_CUDA_OR(cudaStreamSynchronize(R.stream), _exit(3));
    const HostBuf ha = download(a, t, count), hb = download(b, t, count);
    report(R, std::string("passthrough/ar/") + t.name + "==nccl", ha.bytes == hb.bytes, 0,
           fnv(ha.bytes.data(), ha.bytes.size()), true);
    cudaFree(in);
    cudaFree(a);
    cudaFree(b);
  }
  // int32 sum and float max through the planned entry: not eligible, so exact.
  // `host` all-reduced in place on the device with `type` and `op`, back into `host`.
  auto all_reduce_planned = [&](auto& host, ncclDataType_t type, ncclRedOp_t op) {
    const size_t bytes = host.size() * sizeof(host[0]);
    void* dev = nullptr;
    FP8WIRE_CUDA_OR(cudaMalloc(&dev, bytes), _exit(3));
    upload(dev, host.data(), bytes);
    FP8WIRE_NCCL_OR(eng.all_reduce(dev, dev, host.size(), type, op, R.comm, R.stream), _exit(4));
    FP8WIRE_CUDA_OR(cudaStreamSynchronize(R.stream), _exit(3));
    FP8WIRE_CUDA_OR(cudaMemcpy(host.data(), dev, bytes, cudaMemcpyDeviceToHost), _exit(3));
    cudaFree(dev);
  };
  const size_t count = 5000;
  std::vector<int32_t> hi(count);
  for (size_t i = 0; i < count; ++i) hi[i] = static_cast<int32_t>(i * (R.rank + 1));
  all_reduce_planned(hi, ncclInt32, ncclSum);
  bool ok = true;
  const int64_t rank_sum = static_cast<int64_t>(R.n) * (R.n + 1) / 2;
  for (size_t i = 0; i < count; ++i) ok &= hi[i] == static_cast<int32_t>(i * rank_sum);
  report(R, "passthrough/ar/int32-sum-exact", ok, 0, fnv(hi.data(), count * 4), true);
  std::vector<float> hf(count);
  for (size_t i = 0; i < count; ++i) hf[i] = static_cast<float>(i) + R.rank;
  all_reduce_planned(hf, ncclFloat32, ncclMax);
  ok = true;
  for (size_t i = 0; i < count; ++i) ok &= hf[i] == static_cast<float>(i) + (R.n - 1);
  report(R, "passthrough/ar/f32-max-exact", ok, 0, fnv(hf.data(), count * 4), true);
}

// An application group: nested groups, FP8 all-reduces (coalesced into one), a pass-through int32
// all-reduce and the application's own ring send/recv, all inside one ncclGroupStart/End.
void run_group_case(Rank& R, sched::Engine& eng) {
  const TypeInfo& t = kTypes[2];  // bf16
  // Whole blocks, so the packed buffers' quantization blocks are each buffer's own blocks.
  const size_t counts[3] = {1024, 4096, 70016};
  void* bufs[3];
  const uint64_t seq_before = Accounting::instance().next_seq();
  for (int k = 0; k < 3; ++k) {
    FP8WIRE_CUDA_OR(cudaMalloc(&bufs[k], counts[k] * 2), _exit(3));
    make_input(R.rank, counts[k], t, 40 + k, bufs[k]);
  }
  const size_t ring_count = 777;
  int32_t *sendb = nullptr, *recvb = nullptr, *ints = nullptr;
  FP8WIRE_CUDA_OR(cudaMalloc(&sendb, ring_count * 4), _exit(3));
  FP8WIRE_CUDA_OR(cudaMalloc(&recvb, ring_count * 4), _exit(3));
  FP8WIRE_CUDA_OR(cudaMalloc(&ints, ring_count * 4), _exit(3));
  std::vector<int32_t> hs(ring_count, R.rank + 1);
  upload(sendb, hs.data(), ring_count * 4);
  upload(ints, hs.data(), ring_count * 4);

  FP8WIRE_NCCL_OR(eng.group_start(), _exit(4));
  FP8WIRE_NCCL_OR(eng.all_reduce(bufs[0], bufs[0], counts[0], t.nccl, ncclSum, R.comm, R.stream), _exit(4));
  FP8WIRE_NCCL_OR(eng.group_start(), _exit(4));  // nested
  FP8WIRE_NCCL_OR(eng.all_reduce(bufs[1], bufs[1], counts[1], t.nccl, ncclSum, R.comm, R.stream), _exit(4));
  FP8WIRE_NCCL_OR(eng.all_reduce(ints, ints, ring_count, ncclInt32, ncclSum, R.comm, R.stream), _exit(4));
  FP8WIRE_NCCL_OR(ncclSend(sendb, ring_count, ncclInt32, (R.rank + 1) % R.n, R.comm, R.stream), _exit(4));
  FP8WIRE_NCCL_OR(ncclRecv(recvb, ring_count, ncclInt32, (R.rank - 1 + R.n) % R.n, R.comm, R.stream), _exit(4));
  FP8WIRE_NCCL_OR(eng.group_end(), _exit(4));
  FP8WIRE_NCCL_OR(eng.all_reduce(bufs[2], bufs[2], counts[2], t.nccl, ncclSum, R.comm, R.stream), _exit(4));
  FP8WIRE_NCCL_OR(eng.group_end(), _exit(4));
  FP8WIRE_CUDA_OR(cudaStreamSynchronize(R.stream), _exit(3));

  bool ok = true;
  double worst = 0;
  uint64_t hash = kFnvSeed;
  for (int k = 0; k < 3; ++k) {
    const HostBuf h = download(bufs[k], t, counts[k]);
    const ErrStats e = check_sum(h, 1, R.n, 40 + k, t, 2, 1.0, [](size_t i) { return i; });
    ok &= e.finite && e.worst_ratio <= 1.0;
    worst = std::max(worst, e.worst_ratio);
    hash = fnv(h.bytes.data(), h.bytes.size(), hash);
  }
  std::vector<int32_t> hr(ring_count), hint(ring_count);
  FP8WIRE_CUDA_OR(cudaMemcpy(hr.data(), recvb, ring_count * 4, cudaMemcpyDeviceToHost), _exit(3));
  FP8WIRE_CUDA_OR(cudaMemcpy(hint.data(), ints, ring_count * 4, cudaMemcpyDeviceToHost), _exit(3));
  const int prev = (R.rank - 1 + R.n) % R.n;
  bool sendrecv_ok = true, int_ok = true;
  for (size_t i = 0; i < ring_count; ++i) {
    sendrecv_ok &= hr[i] == prev + 1;
    int_ok &= hint[i] == R.n * (R.n + 1) / 2;
  }
  // Accounting: the three bf16 calls went FP8, packed into one collective.
  std::vector<CallRecord> recs(64);
  const size_t nrec = Accounting::instance().snapshot(recs.data(), recs.size(), seq_before);
  uint32_t packed = 0;
  for (size_t i = 0; i < nrec; ++i)
    if (recs[i].path != Path::passthrough && recs[i].path != Path::fallback) packed = std::max(packed, recs[i].coalesced_calls);
  report(R, "group/nested/fp8-within-bound", ok, worst, hash, true);
  report(R, "group/nested/app-sendrecv", sendrecv_ok, 0, 0, false);
  report(R, "group/nested/int32-passthrough-exact", int_ok, 0, 0, false);
  report(R, "group/nested/coalesced-3-calls=" + std::to_string(packed), packed == 3, 0, 0, false);
  for (void* b : bufs) cudaFree(b);
  cudaFree(sendb);
  cudaFree(recvb);
  cudaFree(ints);
}

// A small scratch pool (many pipeline stages) gives bitwise the result of one stage: stages and
// shards are whole blocks, so every block is quantized and reduced exactly as without pipelining.
void run_pipeline_case(Rank& R, sched::Engine& eng) {
  Config small = test_config();
  small.scratch_max_bytes = 2 << 20;
  small.pipeline_chunk_bytes = 256 << 10;
  sched::Engine piped(small, R.platform);
  piped.comm_created(R.comm);  // every rank creates it in the same order: the agreement is collective
  const TypeInfo& t = kTypes[2];
  const size_t count = (size_t{3} << 20) + 17;
  for (Path path : {Path::two_shot, Path::one_shot}) {
    void *in = nullptr, *a = nullptr, *b = nullptr;
    FP8WIRE_CUDA_OR(cudaMalloc(&in, count * 2), _exit(3));
    FP8WIRE_CUDA_OR(cudaMalloc(&a, count * 2), _exit(3));
    FP8WIRE_CUDA_OR(cudaMalloc(&b, count * 2), _exit(3));
    make_input(R.rank, count, t, 77, in);
    FP8WIRE_NCCL_OR(sched::EngineProbe(eng).all_reduce_forced(path, in, a, count, t.nccl, ncclSum, R.comm, R.stream), _exit(4));
    const uint64_t before = Accounting::instance().next_seq();
    FP8WIRE_NCCL_OR(sched::EngineProbe(piped).all_reduce_forced(path, in, b, count, t.nccl, ncclSum, R.comm, R.stream), _exit(4));
    FP8WIRE_CUDA_OR(cudaStreamSynchronize(R.stream), _exit(3));
    const HostBuf ha = download(a, t, count), hb = download(b, t, count);
    std::vector<CallRecord> rec(4);
    const size_t nrec = Accounting::instance().snapshot(rec.data(), rec.size(), before);
    const bool path_ok = nrec >= 1 && rec[0].path == path;
    if (ha.bytes != hb.bytes) {  // diagnosis: where the pipelined result departs from one stage
      size_t first = 0;
      while (first < count && ha.get(first) == hb.get(first)) ++first;
      const ErrStats ea = check_sum(ha, 1, R.n, 77, t, path == Path::one_shot ? 1 : 2, 1.0, [](size_t i) { return i; });
      const ErrStats eb = check_sum(hb, 1, R.n, 77, t, path == Path::one_shot ? 1 : 2, 1.0, [](size_t i) { return i; });
      fprintf(stderr, "rank %d pipeline/%s: first difference at element %zu (single %g, piped %g); "
              "err/bound single %.3f piped %.3f; %zu records\n", R.rank, to_string(path), first,
              first < count ? ha.get(first) : 0.0, first < count ? hb.get(first) : 0.0, ea.worst_ratio,
              eb.worst_ratio, nrec);
    }
    report(R, std::string("pipeline/bf16/") + to_string(path) + "/scratch2MiB==single-stage",
           ha.bytes == hb.bytes && path_ok, 0, fnv(hb.bytes.data(), hb.bytes.size()), true);
    cudaFree(in);
    cudaFree(a);
    cudaFree(b);
  }
  FP8WIRE_CUDA_OR(cudaStreamSynchronize(R.stream), _exit(3));
  piped.comm_destroyed(R.comm);
}

// CUDA graph capture of an engine all-reduce; replays with new inputs equal eager runs bitwise.
void run_graph_case(Rank& R, sched::Engine& eng) {
  const TypeInfo& t = kTypes[2];
  const size_t count = 300000;
  void *buf = nullptr, *in = nullptr, *ref = nullptr;
  FP8WIRE_CUDA_OR(cudaMalloc(&buf, count * 2), _exit(3));
  FP8WIRE_CUDA_OR(cudaMalloc(&in, count * 2), _exit(3));
  FP8WIRE_CUDA_OR(cudaMalloc(&ref, count * 2), _exit(3));
  cudaStream_t cap;
  FP8WIRE_CUDA_OR(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking), _exit(3));
  for (Path path : {Path::two_shot, Path::one_shot}) {
    bool ok = true;
    uint64_t hash = kFnvSeed;
    double worst = 0;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    FP8WIRE_CUDA_OR(cudaStreamBeginCapture(cap, cudaStreamCaptureModeGlobal), _exit(3));
    FP8WIRE_CUDA_OR(cudaMemcpyAsync(buf, in, count * 2, cudaMemcpyDeviceToDevice, cap), _exit(3));
    const ncclResult_t res = sched::EngineProbe(eng).all_reduce_forced(path, buf, buf, count, t.nccl, ncclSum, R.comm, cap);
    FP8WIRE_CUDA_OR(cudaStreamEndCapture(cap, &graph), _exit(3));
    ok &= res == ncclSuccess;
    FP8WIRE_CUDA_OR(cudaGraphInstantiate(&exec, graph, 0), _exit(3));
    for (uint32_t replay = 0; replay < 3; ++replay) {
      make_input(R.rank, count, t, 500 + replay, in);
      FP8WIRE_CUDA_OR(cudaGraphLaunch(exec, cap), _exit(3));
      FP8WIRE_CUDA_OR(cudaStreamSynchronize(cap), _exit(3));
      FP8WIRE_NCCL_OR(sched::EngineProbe(eng).all_reduce_forced(path, in, ref, count, t.nccl, ncclSum, R.comm, R.stream), _exit(4));
      FP8WIRE_CUDA_OR(cudaStreamSynchronize(R.stream), _exit(3));
      const HostBuf hg = download(buf, t, count), hr = download(ref, t, count);
      ok &= hg.bytes == hr.bytes;
      const ErrStats e = check_sum(hg, 7, R.n, 500 + replay, t, path == Path::one_shot ? 1 : 2, 1.0, [](size_t i) { return i; });
      ok &= e.finite && e.worst_ratio <= 1.0;
      worst = std::max(worst, e.worst_ratio);
      hash = fnv(hg.bytes.data(), hg.bytes.size(), hash);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    report(R, std::string("graph/bf16/") + to_string(path) + "/capture+3replays==eager", ok, worst, hash, true);
  }
  cudaStreamDestroy(cap);
  cudaFree(buf);
  cudaFree(in);
  cudaFree(ref);
}

// Error feedback: all-reducing the same input K times, the running mean of the outputs converges to
// the exact sum (the residual carries each quantization error into the next call), while without
// feedback every output repeats the same error. A cap smaller than the buffer turns feedback off:
// then the result equals the plain FP8 one bit for bit.
void run_error_feedback_case(Rank& R) {
  const TypeInfo& t = kTypes[0];  // fp32 output keeps the output rounding out of the comparison
  const size_t count = 1 << 16;
  const int iterations = 8;
  Config with_ef = test_config();
  with_ef.error_feedback = true;
  Config capped = with_ef;
  capped.error_feedback_max_bytes = count * 4 - 1;
  sched::Engine plain(test_config(), R.platform), ef(with_ef, R.platform), ef_capped(capped, R.platform);
  for (sched::Engine* e : {&plain, &ef, &ef_capped}) e->comm_created(R.comm);
  void *in = nullptr, *out = nullptr;
  FP8WIRE_CUDA_OR(cudaMalloc(&in, count * 4), _exit(3));
  FP8WIRE_CUDA_OR(cudaMalloc(&out, count * 4), _exit(3));
  make_input(R.rank, count, t, 901, in);
  auto mean_error = [&](sched::Engine& eng, HostBuf* last) {
    std::vector<double> sum(count, 0.0);
    for (int k = 0; k < iterations; ++k) {
      sched::Engine::set_feedback_key(42);  // the same logical tensor every time
      FP8WIRE_NCCL_OR(sched::EngineProbe(eng).all_reduce_forced(Path::one_shot, in, out, count, t.nccl, ncclSum, R.comm, R.stream), _exit(4));
      FP8WIRE_CUDA_OR(cudaStreamSynchronize(R.stream), _exit(3));
      *last = download(out, t, count);
      for (size_t i = 0; i < count; ++i) sum[i] += last->get(i);
    }
    double err2 = 0;
    for (size_t i = 0; i < count; ++i) {
      double exact = 0;
      for (int r = 0; r < R.n; ++r) exact += rounded_input(r, i, 901, t);
      const double d = sum[i] / iterations - exact;
      err2 += d * d;
    }
    return std::sqrt(err2 / count);
  };
  HostBuf last_plain(t.elem, count), last_ef(t.elem, count), last_capped(t.elem, count);
  const double e_plain = mean_error(plain, &last_plain);
  const double e_ef = mean_error(ef, &last_ef);
  const double e_capped = mean_error(ef_capped, &last_capped);
  char name[160];
  snprintf(name, sizeof(name), "error_feedback/f32/one_shot/rms-mean-err-%.2e-vs-%.2e", e_ef, e_plain);
  report(R, name, e_ef < 0.5 * e_plain, e_ef / e_plain, 0, false);
  report(R, "error_feedback/capped-below-buffer==no-feedback", last_capped.bytes == last_plain.bytes, 0,
         fnv(last_capped.bytes.data(), last_capped.bytes.size()), true);
  FP8WIRE_CUDA_OR(cudaStreamSynchronize(R.stream), _exit(3));
  plain.comm_destroyed(R.comm);
  ef.comm_destroyed(R.comm);
  ef_capped.comm_destroyed(R.comm);
  cudaFree(in);
  cudaFree(out);
}

int rank_main(int rank, int n, const ncclUniqueId& id, const std::string& out_path, bool big, bool per_gpu) {
  int device = 0;
  if (per_gpu) {
    int devices = 1;
    FP8WIRE_CUDA_OR(cudaGetDeviceCount(&devices), _exit(3));
    device = rank % devices;
  }
  Rank R;
  R.rank = rank;
  R.n = n;
  R.big = big;
  R.out = fopen(out_path.c_str(), "w");
  if (!R.out) return 5;
  FP8WIRE_CUDA_OR(cudaSetDevice(device), _exit(3));
  FP8WIRE_CUDA_OR(cudaStreamCreateWithFlags(&R.stream, cudaStreamNonBlocking), _exit(3));
  FP8WIRE_NCCL_OR(ncclCommInitRank(&R.comm, n, id, rank), _exit(4));
  R.api = nccl_api_from_linked();
  R.platform = gpu_platform(R.api);
  // The cases whose FP8 paths have a gather step, which both gather methods run.
  auto run_gather_step_cases = [&](sched::Engine& eng) {
    run_all_reduce_cases(R, eng);
    run_all_gather_cases(R, eng);
    run_all_to_all_cases(R, eng);
    run_group_case(R, eng);
    run_pipeline_case(R, eng);
    run_graph_case(R, eng);
    run_big_cases(R, eng);
  };
  {
    sched::Engine eng(test_config(), R.platform);
    eng.comm_created(R.comm);
    run_passthrough_cases(R, eng);
    run_reduce_scatter_cases(R, eng);
    run_gather_step_cases(eng);
    run_error_feedback_case(R);
    report_direct_usage(R);
    fprintf(R.out, "fabric %s\n", to_string(sched::EngineProbe(eng).fabric_of(R.comm)));
    FP8WIRE_CUDA_OR(cudaStreamSynchronize(R.stream), _exit(3));
    eng.comm_destroyed(R.comm);
  }
  if (g_direct == DirectMode::off) {
    // The same FP8 paths with their gather step done by grouped send/recv (no pass-through or
    // reduce-scatter cases: those have no gather step). The direct transports have no gather step.
    g_gather = GatherMethod::sendrecv;
    R.tag = "sr/";
    sched::Engine eng(test_config(), R.platform);
    eng.comm_created(R.comm);
    run_gather_step_cases(eng);
    FP8WIRE_CUDA_OR(cudaStreamSynchronize(R.stream), _exit(3));
    eng.comm_destroyed(R.comm);
  }
  ncclCommDestroy(R.comm);
  fclose(R.out);
  return 0;
}

struct CaseResult {
  bool pass = true;
  double ratio = 0;
  std::vector<std::string> hashes;
  bool identical_required = false;
};

// `value` of the option `flag` as one of `choices` (by their to_string names) into `out`; false, and a
// line naming the flag, the value and the choices, for any other.
template <class E>
bool parse_choice(const char* flag, const std::string& value, std::initializer_list<E> choices, E& out) {
  std::string names;
  for (E e : choices) {
    if (value == to_string(e)) {
      out = e;
      return true;
    }
    names += (names.empty() ? "" : " or ") + std::string(to_string(e));
  }
  fprintf(stderr, "%s: got '%s', expected %s\n", flag, value.c_str(), names.c_str());
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> worlds = {2, 3, 4};
  bool big = false;
  bool per_gpu = false;
  int timeout_s = 240;
  std::string child_out;  // set in a rank: the file its case lines go to
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--ranks" && i + 1 < argc) {
      worlds = world_sizes(argv[++i]);
    } else if (a == "--big") {
      big = true;
    } else if (a == "--per-gpu") {
      per_gpu = true;
    } else if (a == "--timeout" && i + 1 < argc) {
      timeout_s = std::atoi(argv[++i]);
    } else if (a == "--ranks-per-host" && i + 1 < argc) {
      g_ranks_per_host = std::atoi(argv[++i]);
    } else if (a == "--direct" && i + 1 < argc) {
      if (!parse_choice("--direct", argv[++i], {DirectMode::peer_memory, DirectMode::host_memory}, g_direct)) return 2;
    } else if (a == "--direct-protocol" && i + 1 < argc) {
      if (!parse_choice("--direct-protocol", argv[++i], {DirectProtocol::kernels, DirectProtocol::copy_engine}, g_protocol))
        return 2;
    } else if (a == "--direct-sets" && i + 1 < argc) {
      const int k = std::atoi(argv[++i]);
      if (k < 2 || k > 4) {
        fprintf(stderr, "--direct-sets: got '%s', expected 2..4\n", argv[i]);
        return 2;
      }
      g_sets = static_cast<uint32_t>(k);
    } else if (a == "--rank-output" && i + 1 < argc) {
      child_out = argv[++i];
    } else {
      fprintf(stderr, "unknown argument '%s'; expected --ranks 2,3,4 | --big | --timeout S | --per-gpu | --ranks-per-host R | "
                      "--direct peer_memory|host_memory | --direct-protocol kernels|copy_engine | --direct-sets K\n",
              a.c_str());
      return 2;
    }
  }
  if (!child_out.empty()) {  // one rank, started by the launcher below
    return run_launched_rank(timeout_s, [&](const RankEnv& env, const ncclUniqueId& id) {
      return rank_main(env.rank, env.world_size, id, child_out + std::to_string(env.rank), big, per_gpu);
    });
  }
  for (int n : worlds) {
    if (n < 2 || n > 16) {
      fprintf(stderr, "--ranks: world size %d out of range; expected 2..16\n", n);
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  if (per_gpu) {
    // NCCL rejects two ranks of one host on one GPU ("Duplicate GPU"): one rank per GPU only.
    for (int n : worlds)
      if (n > devices) {
        fprintf(stderr, "--per-gpu: world size %d needs %d GPUs, %d visible; use --ranks 2..%d\n", n, n, devices, devices);
        return 2;
      }
  }
  int failures = 0;
  std::vector<std::string> summary;
  for (int n : worlds) {
    const std::string prefix = "/tmp/fp8wire_multirank_" + std::to_string(getpid()) + "_" + std::to_string(n) + "_";
    LaunchSpec spec;
    spec.argv = {"/proc/self/exe", "--rank-output", prefix, "--timeout", std::to_string(timeout_s)};
    if (g_ranks_per_host) spec.argv.insert(spec.argv.end(), {"--ranks-per-host", std::to_string(g_ranks_per_host)});
    if (g_direct != DirectMode::off) spec.argv.insert(spec.argv.end(), {"--direct", to_string(g_direct)});
    if (g_protocol != DirectProtocol::automatic) spec.argv.insert(spec.argv.end(), {"--direct-protocol", to_string(g_protocol)});
    if (g_sets != Config{}.direct_sets) spec.argv.insert(spec.argv.end(), {"--direct-sets", std::to_string(g_sets)});
    if (big && n == worlds.front()) spec.argv.push_back("--big");
    if (per_gpu) spec.argv.push_back("--per-gpu");
    else spec.one_gpu = true;
    // One rank per GPU with --ranks-per-host: NCCL too sees hosts of that many GPUs (a stand-in for a
    // job spanning hosts: its own transports inside a "host", sockets between them).
    if (per_gpu && g_ranks_per_host) spec.env_per_rank = host_blocks_env(n, g_ranks_per_host);
    spec.nranks = n;
    spec.timeout_s = timeout_s + 30;
    const LaunchResult launched = launch_local_ranks(spec);
    const bool ranks_ok = launched.ok;
    if (!ranks_ok) fprintf(stderr, "FAIL: world size %d: %s\n", n, launched.error.c_str());
    std::vector<std::string> files;
    for (int r = 0; r < n; ++r) files.push_back(prefix + std::to_string(r));
    std::map<std::string, CaseResult> results;
    std::vector<std::string> order;
    std::string fabric = "?";
    for (const std::string& f : files) {
      std::ifstream in(f);
      std::string line;
      while (std::getline(in, line)) {
        std::istringstream ls(line);
        std::string name, status, hash;
        double ratio = 0;
        int ident = 0;
        ls >> name;
        if (name == "fabric") {
          ls >> fabric;
          continue;
        }
        ls >> status >> ratio >> hash >> ident;
        if (!results.count(name)) order.push_back(name);
        CaseResult& c = results[name];
        c.pass &= status == "PASS";
        c.ratio = std::max(c.ratio, ratio);
        c.hashes.push_back(hash);
        c.identical_required = ident != 0;
      }
      unlink(f.c_str());
    }
    printf("=== world size %d (fabric %s) ===\n", n, fabric.c_str());
    int pass = 0, fail = 0;
    for (const std::string& name : order) {
      CaseResult& c = results[name];
      const bool identical = std::all_of(c.hashes.begin(), c.hashes.end(), [&](const std::string& h) { return h == c.hashes[0]; });
      const bool all_ranks = static_cast<int>(c.hashes.size()) == n;
      const bool ok = c.pass && all_ranks && (!c.identical_required || identical);
      printf("%s n=%d %-58s err/bound %.3f %s\n", ok ? "PASS" : "FAIL", n, name.c_str(), c.ratio,
             c.identical_required ? (identical ? "ranks-identical" : "RANKS-DIFFER") : "");
      ok ? ++pass : ++fail;
    }
    if (!ranks_ok) ++fail;
    failures += fail;
    char line[200];
    snprintf(line, sizeof(line), "%s multirank world=%d fabric=%s cases=%d pass=%d fail=%d%s", fail ? "FAIL" : "PASS", n,
             fabric.c_str(), pass + fail, pass, fail, ranks_ok ? "" : " (a rank crashed or timed out)");
    summary.push_back(line);
  }
  printf("=== multirank_collectives summary ===\n");
  for (const std::string& s : summary) printf("%s\n", s.c_str());
  return failures ? 1 : 0;
}
