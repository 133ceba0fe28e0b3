#include <doctest/doctest.h>

#include "bench/host/stats.hpp"
#include "bench/host/units.hpp"

using namespace fp8wire;
using namespace fp8wire::bench;

TEST_CASE("sizes parse with binary units and reject garbage") {
  CHECK(parse_bytes("4KiB") == 4096u);
  CHECK(parse_bytes("4K") == 4096u);
  CHECK(parse_bytes("64MiB") == (64ull << 20));
  CHECK(parse_bytes("1GiB") == (1ull << 30));
  CHECK(parse_bytes("1gib") == (1ull << 30));
  CHECK(parse_bytes("1.5MiB") == (3ull << 19));
  CHECK(parse_bytes("767 KiB") == 767u * 1024u);
  CHECK(parse_bytes("65536") == 65536u);
  CHECK(parse_bytes(" 12B ") == 12u);
  CHECK_FALSE(parse_bytes("").has_value());
  CHECK_FALSE(parse_bytes("KiB").has_value());
  CHECK_FALSE(parse_bytes("4XB").has_value());
  CHECK_FALSE(parse_bytes("-4KiB").has_value());
  CHECK_FALSE(parse_bytes("0.3B").has_value());           // not a whole byte count
  CHECK_FALSE(parse_bytes("99999999999TiB").has_value()); // overflow
  CHECK_FALSE(parse_bytes("1.2.3").has_value());
}

TEST_CASE("sizes format exactly when they can, and round trip") {
  CHECK(format_bytes(0) == "0 B");
  CHECK(format_bytes(1000) == "1000 B");
  CHECK(format_bytes(4096) == "4 KiB");
  CHECK(format_bytes(767 * 1024) == "767 KiB");
  CHECK(format_bytes(3ull << 19) == "1.5 MiB");
  CHECK(format_bytes(1ull << 30) == "1 GiB");
  for (uint64_t v : {4096ull, 1ull << 20, 64ull << 20, 1ull << 30, 3ull << 40})
    CHECK(parse_bytes(format_bytes(v)) == v);
}

TEST_CASE("size series: geometric, inclusive, rounded to the granule") {
  const auto s = size_series(4096, 1ull << 30, 2, 1);
  REQUIRE(s.size() == 19);
  CHECK(s.front() == 4096);
  CHECK(s.back() == (1ull << 30));
  const auto odd = size_series(1000, 100000, 10, 48);  // 3 ranks x 16 B
  REQUIRE(odd.size() == 3);
  CHECK(odd[0] == 960);
  CHECK(odd[1] == 9984);
  CHECK(odd[2] == 99984);
  CHECK(size_series(16, 64, 1.0, 1).empty());  // step must grow
  CHECK(size_series(64, 16, 2.0, 1).empty());  // max below min
  CHECK(size_series(8, 64, 2, 32) == std::vector<uint64_t>{32, 64});  // sizes rounding to 0 dropped
}

TEST_CASE("busbw factors are the nccl-tests ones") {
  CHECK(busbw_factor(Collective::all_reduce, 2) == doctest::Approx(1.0));
  CHECK(busbw_factor(Collective::all_reduce, 8) == doctest::Approx(1.75));
  CHECK(busbw_factor(Collective::reduce_scatter, 4) == doctest::Approx(0.75));
  CHECK(busbw_factor(Collective::all_gather, 8) == doctest::Approx(0.875));
  CHECK(busbw_factor(Collective::all_gather, 1) == 0.0);
  CHECK(busbw_factor(Collective::all_to_all, 4) == doctest::Approx(0.75));  // alltoall_perf's (n-1)/n
  CHECK(busbw_factor(Collective::send_recv, 4) == doctest::Approx(1.0));    // sendrecv_perf's
  // 1e9 bytes in 1000 us = 1e12 B/s = 1000 GB/s.
  CHECK(algbw_gbps(1000000000ull, 1000.0) == doctest::Approx(1000.0));
  CHECK(algbw_gbps(1 << 20, 0) == 0.0);
}

TEST_CASE("call counts follow nccl-tests' full-buffer size") {
  const auto ar = call_counts(Collective::all_reduce, 1 << 20, DType::bf16, 4);
  CHECK(ar.send_elems == (1u << 19));
  CHECK(ar.count_arg == (1u << 19));
  const auto rs = call_counts(Collective::reduce_scatter, 1 << 20, DType::f32, 4);
  CHECK(rs.send_elems == (1u << 18));
  CHECK(rs.recv_elems == (1u << 16));
  CHECK(rs.count_arg == (1u << 16));
  const auto ag = call_counts(Collective::all_gather, 1 << 20, DType::f16, 2);
  CHECK(ag.send_elems == (1u << 18));
  CHECK(ag.recv_elems == (1u << 19));
  // All-to-all: the size is the send buffer (alltoall_perf); the count is per peer.
  const auto a2a = call_counts(Collective::all_to_all, 1 << 20, DType::bf16, 4);
  CHECK(a2a.send_elems == (1u << 19));
  CHECK(a2a.recv_elems == (1u << 19));
  CHECK(a2a.count_arg == (1u << 17));
}

TEST_CASE("names parse and print") {
  CHECK(parse_dtype("bf16") == DType::bf16);
  CHECK(parse_dtype("FP16") == DType::f16);
  CHECK_FALSE(parse_dtype("int8").has_value());
  CHECK(parse_collective("allreduce") == Collective::all_reduce);
  CHECK(parse_collective("rs") == Collective::reduce_scatter);
  CHECK(parse_collective("alltoall") == Collective::all_to_all);
  CHECK(parse_collective("sendrecv") == Collective::send_recv);
  CHECK(parse_collective("p2p") == Collective::send_recv);
  CHECK(parse_collective(collective_name(Collective::all_to_all)) == Collective::all_to_all);
  CHECK_FALSE(parse_collective("alltoallv").has_value());
  for (Collective c : kCollectives) CHECK(parse_collective(collective_name(c)) == c);
  CHECK(parse_path("nccl") == Path::passthrough);
  CHECK(parse_path(path_name(Path::one_shot)) == Path::one_shot);
  CHECK(parse_fabric(fabric_name(Fabric::pcie)) == Fabric::pcie);
  CHECK(split_list(" a, b,,c ") == std::vector<std::string>{"a", "b", "c"});
}

TEST_CASE("summary statistics: median, quartiles, robust noise, max over ranks") {
  const Summary s = summarize({5, 1, 3, 2, 4});
  CHECK(s.median == 3);
  CHECK(s.p25 == 2);
  CHECK(s.p75 == 4);
  CHECK(s.min == 1);
  CHECK(s.max == 5);
  CHECK(s.mad == 1);
  // One wild repeat barely moves the robust noise.
  const Summary outlier = summarize({100, 100, 101, 99, 100, 1000});
  CHECK(outlier.median == doctest::Approx(100));
  CHECK(outlier.rel_noise() < 0.02);
  CHECK(summarize({}).n == 0);
  CHECK(max_over_ranks({{1, 5, 3}, {2, 4, 3}}) == std::vector<double>{2, 5, 3});
}

TEST_CASE("paths per collective: all-reduce keeps every request; RS, AG and A2A have one FP8 algorithm") {
  const std::vector<Path> all = {Path::two_shot, Path::one_shot, Path::ring};
  CHECK(paths_for(Collective::all_reduce, all) == std::vector<Path>{Path::passthrough, Path::two_shot, Path::one_shot, Path::ring});
  CHECK(paths_for(Collective::reduce_scatter, all) == std::vector<Path>{Path::passthrough, Path::two_shot});
  CHECK(paths_for(Collective::all_gather, {Path::ring}) == std::vector<Path>{Path::passthrough, Path::one_shot});
  CHECK(paths_for(Collective::all_gather, {Path::passthrough}) == std::vector<Path>{Path::passthrough});
  CHECK(paths_for(Collective::all_to_all, all) == std::vector<Path>{Path::passthrough, Path::one_shot});
  CHECK(paths_for(Collective::send_recv, all) == std::vector<Path>{Path::passthrough, Path::one_shot});
}

TEST_CASE("--gather-transport: auto forces nothing, one transport, or both in turn") {
  using G = GatherMethod;
  CHECK(parse_gather_transport_option("auto") == std::vector<G>{});
  CHECK(parse_gather_transport_option("allgather") == std::vector<G>{G::allgather});
  CHECK(parse_gather_transport_option("sendrecv") == std::vector<G>{G::sendrecv});
  CHECK(parse_gather_transport_option("Both") == std::vector<G>{G::allgather, G::sendrecv});
  CHECK_FALSE(parse_gather_transport_option("nvls"));
  CHECK_FALSE(parse_gather_transport_option(""));
  for (const char* name : {"auto", "allgather", "sendrecv", "both"})
    CHECK(gather_transport_option_name(*parse_gather_transport_option(name)) == name);
}
