#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "bench/host/model_report.hpp"
#include "bench/host/profile.hpp"
#include "bench/host/results.hpp"
#include "sched/plan/cost_model.hpp"

using namespace fp8wire;
using namespace fp8wire::bench;

namespace {
// Whether sweep_from_json refuses `j` with the value at JSON pointer `at` replaced by `value`, with an
// error that contains `expected`.
bool refuses(nlohmann::json j, const char* at, const char* value, const std::string& expected) {
  j[nlohmann::json::json_pointer(at)] = value;
  std::string error;
  const bool refused = !sweep_from_json(j, error);
  INFO(error);
  CHECK(error.find(expected) != std::string::npos);
  return refused;
}

// A synthetic 2-rank all-reduce sweep on "pcie": baseline 30 us + 10 GB/s bus, two_shot 70 us +
// half the bytes; one_shot slower at large sizes; reduce_scatter never wins.
SweepResult synthetic_sweep() {
  SweepResult r;
  r.machine.hostname = "testhost";
  r.machine.gpu_name = "Test GPU";
  r.machine.nranks = 2;
  r.machine.fabric = Fabric::pcie;
  r.machine.nccl_version = 22809;
  r.codec = {1200.0, 3.0, "test"};
  for (uint64_t bytes = 4096; bytes <= (64u << 20); bytes *= 4) {
    const double b = static_cast<double>(bytes);
    auto add = [&](Collective c, Path p, double us) {
      SweepPoint pt;
      pt.collective = c;
      pt.dtype = DType::bf16;
      pt.path = p;
      pt.bytes = bytes;
      pt.count = bytes / 2;
      pt.times_us = {us, us * 1.01, us * 0.99, us};
      pt.time = summarize(pt.times_us);
      pt.check.ran = true;
      pt.check.pass = true;
      pt.check.bound = p == Path::passthrough ? 0 : 0.1328;
      r.points.push_back(pt);
    };
    add(Collective::all_reduce, Path::passthrough, 30 + b / 10e3);
    add(Collective::all_reduce, Path::two_shot, 70 + 0.5 * b / 10e3);
    add(Collective::all_reduce, Path::one_shot, 50 + 0.8 * b / 10e3);
    add(Collective::reduce_scatter, Path::passthrough, 20 + b / 20e3);
    add(Collective::reduce_scatter, Path::two_shot, 40 + 1.2 * b / 20e3);
  }
  compute_speedups(r);
  return r;
}
}  // namespace

TEST_CASE("speedups and crossovers of a synthetic sweep") {
  const SweepResult r = synthetic_sweep();
  const auto reports = analyze_crossovers(r, {});
  const CrossoverReport* best = nullptr;
  const CrossoverReport* rs = nullptr;
  for (const auto& x : reports) {
    if (x.collective == Collective::all_reduce && x.candidate == "best") best = &x;
    if (x.collective == Collective::reduce_scatter && x.candidate == "best") rs = &x;
  }
  REQUIRE(best);
  REQUIRE(rs);
  // 256 KiB: baseline 56 us, one_shot 71, two_shot 83: a loss. 1 MiB: baseline 135 us, one_shot 134
  // (a tie), two_shot 122 (a 9 % win): the "best" curve crosses at 1 MiB.
  CHECK(best->crossover.found);
  CHECK(best->crossover.bytes == (1u << 20));
  CHECK_FALSE(rs->crossover.found);
}

TEST_CASE("JSON round trip keeps points, machine and analysis") {
  const SweepResult r = synthetic_sweep();
  const auto reports = analyze_crossovers(r, {});
  const Calibration cal = calibrate(r);
  const nlohmann::json j = to_json(r, reports, cal);
  std::string error;
  const auto back = sweep_from_json(j, error);
  REQUIRE_MESSAGE(back, error);
  CHECK(back->machine.nranks == 2);
  CHECK(back->machine.fabric == Fabric::pcie);
  CHECK(back->machine.hostname == "testhost");
  REQUIRE(back->points.size() == r.points.size());
  CHECK(back->points[3].time.median == doctest::Approx(r.points[3].time.median));
  CHECK(back->points[4].speedup == doctest::Approx(r.points[4].speedup));
  CHECK(back->codec.gbps == doctest::Approx(1200.0));
  const auto again = analyze_crossovers(*back, {});
  REQUIRE(again.size() == reports.size());
  for (size_t i = 0; i < again.size(); ++i) CHECK(again[i].crossover.bytes == reports[i].crossover.bytes);

  CHECK(refuses(j, "/points/0/path", "warp", "warp"));
  CHECK(refuses(j, "/machine/fabric", "carrier-pigeon", "carrier-pigeon"));
}

TEST_CASE("calibration recovers the baseline's alpha and bus bandwidth") {
  const Calibration cal = calibrate(synthetic_sweep());
  CHECK(cal.model.calibrated);
  // all_reduce on 2 ranks: bus bytes = S, so 30 us + S / 10 GB/s.
  CHECK(cal.model.op_latency_us == doctest::Approx(30.0).epsilon(1e-6));
  CHECK(cal.model.bus_bandwidth_gbps == doctest::Approx(10.0).epsilon(1e-6));
  CHECK(cal.model.codec_gbps == doctest::Approx(1200.0));
  CHECK(cal.model.kernel_launch_us == doctest::Approx(3.0));
}

TEST_CASE("calibration fits each NCCL operation's latency and bandwidth from the points that use it") {
  const Calibration cal = calibrate(synthetic_sweep());
  const CostModel& m = cal.model;
  const double r = 132.0 / 256.0;  // wire bytes per bf16 byte
  // Plain all-reduce and reduce-scatter (2 ranks: bus bytes S and S/2).
  CHECK(m.allreduce_latency_us == doctest::Approx(30.0).epsilon(1e-6));
  CHECK(m.allreduce_bandwidth_gbps == doctest::Approx(10.0).epsilon(1e-6));
  CHECK(m.reduce_scatter_latency_us == doctest::Approx(20.0).epsilon(1e-6));
  CHECK(m.reduce_scatter_bandwidth_gbps == doctest::Approx(10.0).epsilon(1e-6));
  // All-gather from one-shot (50 us + 0.8 S / 10 GB/s): minus 2 launches (6 us) and 3 S through the
  // codec, the rest over (n-1) r S bus bytes.
  CHECK(m.allgather_latency_us == doctest::Approx(44.0).epsilon(1e-6));
  CHECK(m.allgather_bandwidth_gbps == doctest::Approx(1e-3 / ((0.8 / 10e3 - 3 / 1.2e6) / r)).epsilon(1e-6));
  // Grouped send/recv from FP8 reduce-scatter (40 us + 1.2 S / 20 GB/s): minus 2 launches and 2 S
  // through the codec, the rest over r S / 2 bus bytes.
  CHECK(m.alltoall_latency_us == doctest::Approx(34.0).epsilon(1e-6));
  CHECK(m.alltoall_bandwidth_gbps == doctest::Approx(1e-3 / ((1.2 / 20e3 - 2 / 1.2e6) / (0.5 * r))).epsilon(1e-6));
  // Each fitted path is reproduced exactly by the model with these figures.
  WireParams wire{DType::bf16, 128, 4};
  const double S = 64.0 * (1 << 20);
  CHECK(predict_us(Collective::all_reduce, Path::one_shot, 2, S, cal.link, cal.codec, wire) ==
        doctest::Approx(50 + 0.8 * S / 10e3));
  CHECK(predict_us(Collective::reduce_scatter, Path::two_shot, 2, S, cal.link, cal.codec, wire) ==
        doctest::Approx(40 + 1.2 * S / 20e3));
}

TEST_CASE("relative fit of a part of a measured time") {
  // y = 5 + 2x is the part of t = y + 100 the model does not know; weights follow t.
  const std::vector<double> x = {1, 10, 100}, y = {7, 25, 205}, t = {107, 125, 305};
  const LinearFit f = fit_linear_relative_to(x, y, t);
  CHECK(f.ok);
  CHECK(f.alpha_us == doctest::Approx(5.0));
  CHECK(f.us_per_byte == doctest::Approx(2.0));
  CHECK(f.max_rel_residual == doctest::Approx(0.0).epsilon(1e-9));
}

TEST_CASE("profile: measured threshold, never for a loser, cost model block") {
  const SweepResult r = synthetic_sweep();
  const auto reports = analyze_crossovers(r, {});
  const FabricProfile p = profile_from_sweep(r, reports, calibrate(r));
  REQUIRE(p.thresholds[0]);
  CHECK(p.thresholds[0]->bytes == (1u << 20));
  REQUIRE(p.thresholds[1]);
  CHECK(p.thresholds[1]->bytes == kNeverThreshold);
  CHECK_FALSE(p.thresholds[2]);  // all_gather not measured: not written
  const std::string toml = render_profile_toml({p});
  CHECK(toml.find("[thresholds.all_reduce]\npcie = 1048576") != std::string::npos);
  CHECK(toml.find("[thresholds.reduce_scatter]\npcie = 9223372036854775807") != std::string::npos);
  CHECK(toml.find("[cost_model.pcie]") != std::string::npos);
  CHECK(toml.find("calibrated = true") != std::string::npos);
  CHECK(toml.find("all_gather") == std::string::npos);
}

TEST_CASE("tables and reports render every point and failure") {
  SweepResult r = synthetic_sweep();
  const std::string table = render_table(r, Collective::all_reduce, DType::bf16);
  CHECK(table.find("64 MiB") != std::string::npos);
  CHECK(table.find("two_shot") != std::string::npos);
  CHECK(table.find("PASS") != std::string::npos);
  CHECK(failed_checks(r).empty());
  r.points[1].check.pass = false;
  r.points[1].check.mismatches = 7;
  REQUIRE(failed_checks(r).size() == 1);
  CHECK(failed_checks(r)[0].find("7 beyond bound") != std::string::npos);
  r.points[2].check.bitwise_required = true;
  r.points[2].check.bitwise_identical = false;
  CHECK(failed_checks(r).size() == 2);

  SweepResult other = synthetic_sweep();
  other.machine.fabric = Fabric::nvlink;
  const std::string side = render_fabric_comparison({synthetic_sweep(), other}, {});
  CHECK(side.find("pcie (2 ranks)") != std::string::npos);
  CHECK(side.find("nvlink (2 ranks)") != std::string::npos);
}

TEST_CASE("model report: checked against the measured fabric, predictions labelled") {
  ModelOptions options;
  options.nranks = {8};
  const ModelReport rep = model_report({synthetic_sweep()}, options);
  CHECK(rep.text.find("PREDICTED") != std::string::npos);
  CHECK(rep.text.find("pcie_gen5") != std::string::npos);
  CHECK(rep.text.find("measured:pcie") == std::string::npos);  // links are named in the JSON only
  REQUIRE(rep.json["checks"].size() >= 2);
  for (const auto& p : rep.json["predictions"]) CHECK(p["predicted"] == true);
  // Every prediction for 2 and 8 ranks of every assumed link and collective.
  CHECK(rep.json["predictions"].size() == assumed_links().size() * 2 * std::size(kCollectives));
}

namespace {
// The synthetic sweep's all-reduce points alone, its FP8 ones run with the gather step over
// send/recv (as `sweep --gather-transport sendrecv` records them).
SweepResult sendrecv_allreduce_sweep(bool two_shot_too) {
  SweepResult r = synthetic_sweep();
  std::erase_if(r.points, [](const SweepPoint& p) { return p.collective != Collective::all_reduce; });
  for (auto& p : r.points) {
    if (p.path == Path::one_shot || (two_shot_too && p.path == Path::two_shot)) p.gather_transport = "sendrecv";
    else if (p.path == Path::two_shot) p.gather_transport = "allgather";
  }
  r.gather_transport_requested = "sendrecv";
  r.gather_transport_config = "sendrecv";
  return r;
}
}  // namespace

TEST_CASE("JSON round trip keeps each point's gather transport; older files read as all-gather") {
  const SweepResult r = sendrecv_allreduce_sweep(true);
  const nlohmann::json j = to_json(r, analyze_crossovers(r, {}), calibrate(r));
  CHECK(j["gather_transport"]["requested"] == "sendrecv");
  std::string error;
  const auto back = sweep_from_json(j, error);
  REQUIRE_MESSAGE(back, error);
  CHECK(back->gather_transport_requested == "sendrecv");
  CHECK(back->gather_transport_config == "sendrecv");
  REQUIRE(back->points.size() == r.points.size());
  for (size_t i = 0; i < r.points.size(); ++i) {
    CAPTURE(i);
    CHECK(back->points[i].gather_transport == r.points[i].gather_transport);
  }

  // A file written before the transport was recorded: FP8 paths with a gather step used ncclAllGather.
  nlohmann::json old = to_json(synthetic_sweep(), {}, calibrate(synthetic_sweep()));
  old.erase("gather_transport");
  for (auto& p : old["points"]) p.erase("gather_transport");
  const auto read = sweep_from_json(old, error);
  REQUIRE_MESSAGE(read, error);
  CHECK(read->gather_transport_requested.empty());
  for (const auto& p : read->points) {
    CAPTURE(path_name(p.path));
    const bool gathers = p.collective != Collective::reduce_scatter && p.path != Path::passthrough;
    CHECK(p.gather_transport == (gathers ? "allgather" : ""));
  }

  CHECK(refuses(j, "/points/1/gather_transport", "carrier-pigeon", "points[1].gather_transport 'carrier-pigeon'"));
  CHECK(refuses(j, "/gather_transport/requested", "nvls", "gather_transport.requested 'nvls'"));
}

TEST_CASE("tables label the FP8 paths whose gather step went over send/recv") {
  SweepResult r = sendrecv_allreduce_sweep(false);
  r.points[2].gather_transport = "mixed";
  const std::string table = render_table(r, Collective::all_reduce, DType::bf16);
  CHECK(table.find("one_shot/sr") != std::string::npos);
  CHECK(table.find("one_shot/mix") != std::string::npos);
  CHECK(table.find("two_shot/") == std::string::npos);      // all-gather: no suffix
  CHECK(table.find("passthrough/") == std::string::npos);
}

TEST_CASE("calibration: one-shot points over send/recv calibrate all_to_all and leave all_gather alone") {
  const Calibration cal = calibrate(sendrecv_allreduce_sweep(false));
  const CostModel& m = cal.model;
  const double r = 132.0 / 256.0;
  // The same one-shot points as the all-gather fit above (50 us + 0.8 S / 10 GB/s, minus 2 launches
  // and 3 S through the codec, the rest over (n-1) r S bus bytes), now feeding the a2a figures.
  CHECK(m.alltoall_latency_us == doctest::Approx(44.0).epsilon(1e-6));
  CHECK(m.alltoall_bandwidth_gbps == doctest::Approx(1e-3 / ((0.8 / 10e3 - 3 / 1.2e6) / r)).epsilon(1e-6));
  CHECK(m.allgather_latency_us == 0);
  CHECK(m.allgather_bandwidth_gbps == 0);
  WireParams wire{DType::bf16, 128, 4};
  const double S = 64.0 * (1 << 20);
  CHECK(predict_us(Collective::all_reduce, Path::one_shot, 2, S, cal.link, cal.codec, wire, GatherMethod::sendrecv) ==
        doctest::Approx(50 + 0.8 * S / 10e3));
  CHECK(cal.link.basis.find("all_to_all 44 us") != std::string::npos);
  CHECK(cal.link.basis.find("all_reduce over send/recv") != std::string::npos);
}

TEST_CASE("calibration: two-shot over send/recv is two a2a, none of them an all-gather") {
  SweepResult s = sendrecv_allreduce_sweep(true);
  std::erase_if(s.points, [](const SweepPoint& p) { return p.path == Path::one_shot; });
  const Calibration cal = calibrate(s);
  const CostModel& m = cal.model;
  const double r = 132.0 / 256.0;
  // 70 us + 0.5 S / 10 GB/s: minus 3 launches (9 us) and 3 S through the codec, two a2a of r S / 2
  // bus bytes each (2 ranks).
  CHECK(m.alltoall_latency_us == doctest::Approx((70.0 - 9.0) / 2).epsilon(1e-6));
  CHECK(m.alltoall_bandwidth_gbps == doctest::Approx(1e-3 / ((0.5 / 10e3 - 3 / 1.2e6) / r)).epsilon(1e-6));
  CHECK(m.allgather_latency_us == 0);
  WireParams wire{DType::bf16, 128, 4};
  const double S = 64.0 * (1 << 20);
  CHECK(predict_us(Collective::all_reduce, Path::two_shot, 2, S, cal.link, cal.codec, wire, GatherMethod::sendrecv) ==
        doctest::Approx(70 + 0.5 * S / 10e3));
  // Mixed points fit nothing: no single shape describes them.
  for (auto& p : s.points)
    if (p.path == Path::two_shot) p.gather_transport = "mixed";
  CHECK(calibrate(s).model.alltoall_latency_us == 0);
}

namespace {
// `sweep --gather-transport both` on the synthetic all-reduce: each FP8 path timed over all-gather
// (the synthetic times) and over send/recv: one_shot/sr 20 us + S / 10 GB/s (a lower fixed cost
// than plain NCCL at the same slope: faster at small sizes, a tie at large ones), two_shot/sr 60 us +
// 0.6 S / 10 GB/s.
SweepResult both_transports_sweep() {
  SweepResult r = synthetic_sweep();
  std::erase_if(r.points, [](const SweepPoint& p) { return p.collective != Collective::all_reduce; });
  std::vector<SweepPoint> points;
  for (SweepPoint p : r.points) {
    if (p.path == Path::passthrough) {
      points.push_back(p);
      continue;
    }
    p.gather_transport = "allgather";
    points.push_back(p);
    const double b = static_cast<double>(p.bytes);
    // Over send/recv both paths issue only a2a: one-shot 20 us + S / 10 GB/s fixes the a2a figures
    // (calibration test below), and two-shot is what the model says with those same figures, so one
    // pooled fit explains both curves exactly.
    Link a2a;
    a2a.alpha_us = 30;
    a2a.bus_gbps = 10;
    a2a.alltoall_us = 14;
    a2a.alltoall_gbps = 1e-3 / ((1.0 / 10e3 - 3 / 1.2e6) / (132.0 / 256.0));
    const double us = p.path == Path::one_shot ? 20 + b / 10e3
                      : p.path == Path::two_shot
                          ? predict_us(Collective::all_reduce, Path::two_shot, r.machine.nranks, b, a2a, r.codec,
                                       WireParams{DType::bf16, 128, 4}, GatherMethod::sendrecv)
                          : 0;
    if (us == 0) continue;
    p.gather_transport = "sendrecv";
    p.times_us = {us, us * 1.01, us * 0.99, us};
    p.time = summarize(p.times_us);
    points.push_back(p);
  }
  r.points = std::move(points);
  r.gather_transport_requested = "both";
  r.gather_transport_config = "both";
  compute_speedups(r);
  return r;
}
const CrossoverReport* report_of(const std::vector<CrossoverReport>& reports, const std::string& candidate) {
  for (const auto& x : reports)
    if (x.collective == Collective::all_reduce && x.candidate == candidate) return &x;
  return nullptr;
}
}  // namespace

TEST_CASE("both gather transports: separate curves, speedups against the one baseline, best over all") {
  const SweepResult r = both_transports_sweep();
  for (const auto& p : r.points) {
    CAPTURE(path_label(p));
    const double base = 30 + static_cast<double>(p.bytes) / 10e3;
    CHECK(p.speedup == doctest::Approx(base / p.time.median));
  }
  const auto reports = analyze_crossovers(r, {});
  std::vector<std::string> names;
  for (const auto& x : reports) names.push_back(x.candidate);
  CHECK(names == std::vector<std::string>{"two_shot", "two_shot/sr", "one_shot", "one_shot/sr", "best"});
  const CrossoverReport* one = report_of(reports, "one_shot");
  const CrossoverReport* one_sr = report_of(reports, "one_shot/sr");
  const CrossoverReport* best = report_of(reports, "best");
  REQUIRE((one && one_sr && best));
  CHECK(one->path == Path::one_shot);
  CHECK(one->gather_transport == "allgather");
  CHECK(one_sr->path == Path::one_shot);
  CHECK(one_sr->gather_transport == "sendrecv");
  CHECK_FALSE(best->path);
  // The all-gather one-shot alone crosses at 4 MiB (1 MiB ties); over send/recv it wins from the
  // smallest size (30.4 vs 20.4 us at 4 KiB).
  CHECK(one->crossover.bytes == (4u << 20));
  CHECK(one_sr->crossover.at_smallest);
  // best: per size the fastest of all four curves, so it takes one_shot/sr at 4 KiB (the all-gather
  // sweep's best crossed at 1 MiB) and two-shot at the top.
  CHECK(best->crossover.found);
  CHECK(best->crossover.at_smallest);
  CHECK(best->crossover.bytes == 4096);
  CHECK(best->crossover.speedup == doctest::Approx(30.4096 / 20.4096));
  for (Outcome o : best->crossover.outcomes) CHECK(o == Outcome::win);

  // One row per curve in the table; the crossovers list both.
  const std::string table = render_table(r, Collective::all_reduce, DType::bf16);
  size_t rows_4k = 0;
  for (size_t at = table.find("\n       4 KiB"); at != std::string::npos; at = table.find("\n       4 KiB", at + 1)) ++rows_4k;
  CHECK(rows_4k == 5);  // passthrough, two_shot, two_shot/sr, one_shot, one_shot/sr
  CHECK(table.find("two_shot/sr") != std::string::npos);
  CHECK(render_crossovers(r, reports).find("one_shot/sr") != std::string::npos);
}

TEST_CASE("both gather transports: JSON says both; calibration fits all_gather and all_to_all") {
  const SweepResult r = both_transports_sweep();
  const Calibration cal = calibrate(r);
  const nlohmann::json j = to_json(r, analyze_crossovers(r, {}), cal);
  CHECK(j["gather_transport"]["requested"] == "both");
  CHECK(j["gather_transport"]["config"] == "both");
  std::string error;
  const auto back = sweep_from_json(j, error);
  REQUIRE_MESSAGE(back, error);
  CHECK(back->gather_transport_requested == "both");
  REQUIRE(back->points.size() == r.points.size());
  for (size_t i = 0; i < r.points.size(); ++i) CHECK(back->points[i].gather_transport == r.points[i].gather_transport);

  // all_gather from the one-shot points over all-gather (as in the all-gather sweep above), all_to_all
  // from those over send/recv, one-shot and two-shot pooled: 20 us + S / 10 GB/s minus 2 launches
  // (6 us) and 3 S through the codec, the rest over (n-1) r S bus bytes (two-shot's curve was made
  // from the same figures, so the pooled fit recovers them exactly).
  const CostModel& m = cal.model;
  const double ratio = 132.0 / 256.0;
  CHECK(m.allgather_latency_us == doctest::Approx(44.0).epsilon(1e-6));
  CHECK(m.allgather_bandwidth_gbps == doctest::Approx(1e-3 / ((0.8 / 10e3 - 3 / 1.2e6) / ratio)).epsilon(1e-6));
  CHECK(m.alltoall_latency_us == doctest::Approx(14.0).epsilon(1e-6));
  CHECK(m.alltoall_bandwidth_gbps == doctest::Approx(1e-3 / ((1.0 / 10e3 - 3 / 1.2e6) / ratio)).epsilon(1e-6));
  const WireParams wire{DType::bf16, 128, 4};
  const double S = 64.0 * (1 << 20);
  CHECK(predict_us(Collective::all_reduce, Path::one_shot, 2, S, cal.link, cal.codec, wire) ==
        doctest::Approx(50 + 0.8 * S / 10e3));
  CHECK(predict_us(Collective::all_reduce, Path::one_shot, 2, S, cal.link, cal.codec, wire, GatherMethod::sendrecv) ==
        doctest::Approx(20 + S / 10e3));

  // The profile: the threshold from "best" (FP8 from the smallest size), both operations' figures.
  const FabricProfile profile = profile_from_sweep(r, analyze_crossovers(r, {}), cal);
  REQUIRE(profile.thresholds[0]);
  CHECK(profile.thresholds[0]->bytes == 4096);
  const std::string toml = render_profile_toml({profile});
  CHECK(toml.find("allgather_latency_us = 44.000") != std::string::npos);
  CHECK(toml.find("alltoall_latency_us = 14.000") != std::string::npos);
}

TEST_CASE("both gather transports: the model report checks each curve with its own transport") {
  ModelOptions options;
  options.nranks = {8};
  const ModelReport rep = model_report({both_transports_sweep()}, options);
  int one_shot_checks = 0;
  for (const auto& c : rep.json["checks"]) {
    if (c["path"] != "one_shot") continue;
    ++one_shot_checks;
    CHECK((c["gather_transport"] == "allgather" || c["gather_transport"] == "sendrecv"));
    // Each curve is reproduced by the figures fitted from it.
    CHECK(c["worst_time_error"].get<double>() < 1e-6);
  }
  CHECK(one_shot_checks == 2);
  CHECK(rep.text.find("one_shot/sr") != std::string::npos);
  bool small_best_sr = false;
  for (const auto& c : rep.json["choices"])
    if (c["bytes"] == 4096) small_best_sr = c["measured_best"] == "one_shot/sr" && c["chosen"] == "one_shot/sr";
  CHECK(small_best_sr);
}

TEST_CASE("the direct transport: its own curves, JSON round trip, and its barrier latency and link bandwidth fitted") {
  SweepResult r = synthetic_sweep();
  // Direct points generated from the model itself: 20 us per barrier, a 45 GB/s link.
  CostModel m;
  m.codec_gbps = 1200.0;
  m.kernel_launch_us = 3.0;
  quant::WireFormat f;
  for (uint64_t bytes = 4096; bytes <= (64u << 20); bytes *= 4)
    for (Path p : {Path::two_shot, Path::one_shot}) {
      const sched::DirectCost d =
          sched::direct_cost_parts(m, Collective::all_reduce, p, bytes, 2, f, Carrier::host_memory);
      const double us = d.barriers * 20.0 + d.link_bytes / 45e3 + d.other_us;
      SweepPoint pt;
      pt.collective = Collective::all_reduce;
      pt.dtype = DType::bf16;
      pt.path = p;
      pt.bytes = bytes;
      pt.count = bytes / 2;
      pt.times_us = {us, us, us};
      pt.time = summarize(pt.times_us);
      pt.transport = "host_memory";
      r.points.push_back(pt);
    }
  compute_speedups(r);
  const Calibration cal = calibrate(r);
  CHECK(cal.model.direct_latency_us == doctest::Approx(20.0).epsilon(1e-3));
  CHECK(cal.model.direct_bandwidth_gbps == doctest::Approx(45.0).epsilon(1e-3));
  // NCCL's figures are fitted from NCCL's points alone: unchanged by the direct ones.
  CHECK(cal.model.op_latency_us == doctest::Approx(30.0).epsilon(1e-6));
  CHECK(cal.model.bus_bandwidth_gbps == doctest::Approx(10.0).epsilon(1e-6));
  // Curves of their own, labelled.
  std::vector<std::string> names;
  for (const auto& x : analyze_crossovers(r, {}))
    if (x.collective == Collective::all_reduce) names.push_back(x.candidate);
  CHECK(names == std::vector<std::string>{"two_shot", "two_shot/direct", "one_shot", "one_shot/direct", "best",
                                          kDirectOverNccl});
  // Where the direct transport starts to pay against fp8wire over NCCL's transports: its 20 us
  // barriers and 45 GB/s beat the NCCL paths' 30 us operations and 10 GB/s at every size here.
  for (const auto& x : analyze_crossovers(r, {}))
    if (x.candidate == kDirectOverNccl) {
      CHECK(x.crossover.found);
      CHECK(x.crossover.at_smallest);
      CHECK(x.crossover.bytes == 4096);
      CHECK_FALSE(x.path.has_value());
    }
  CHECK(render_crossovers(r, analyze_crossovers(r, {})).find("against fp8wire over NCCL's") != std::string::npos);
  // The profile carries the direct figures; the JSON keeps each point's transport.
  const std::string toml = render_profile_toml({profile_from_sweep(r, analyze_crossovers(r, {}), cal)});
  CHECK(toml.find("direct_latency_us = 20.0") != std::string::npos);
  CHECK(toml.find("direct_bandwidth_gbps = 45.0") != std::string::npos);
  std::string error;
  const auto back = sweep_from_json(to_json(r, analyze_crossovers(r, {}), cal), error);
  REQUIRE_MESSAGE(back, error);
  size_t direct = 0;
  for (const auto& p : back->points) direct += p.transport == "host_memory";
  CHECK(direct == 16);
  CHECK(refuses(to_json(r, analyze_crossovers(r, {}), cal), "/points/0/transport", "carrier pigeon", "carrier pigeon"));
}

TEST_CASE("emulated ranks: the testbed mode (MPS or time-sliced) goes into the JSON and the tables") {
  SweepResult r = synthetic_sweep();
  r.machine.emulated = true;
  r.machine.testbed = "mps";
  std::string error;
  const auto back = sweep_from_json(to_json(r, analyze_crossovers(r, {}), calibrate(r)), error);
  REQUIRE_MESSAGE(back, error);
  CHECK(back->machine.testbed == "mps");
  CHECK(render_table(*back, Collective::all_reduce, DType::bf16).find("(emulated, 1 GPU, side by side under MPS)") !=
        std::string::npos);
  r.machine.testbed = "time-sliced";
  CHECK(render_table(r, Collective::all_reduce, DType::bf16).find("(emulated, 1 GPU, time-sliced)") != std::string::npos);
  // Files written before the mode was recorded read as unknown.
  nlohmann::json old = to_json(r, analyze_crossovers(r, {}), calibrate(r));
  old["machine"].erase("testbed");
  const auto read = sweep_from_json(old, error);
  REQUIRE_MESSAGE(read, error);
  CHECK(read->machine.testbed.empty());
  CHECK(render_table(*read, Collective::all_reduce, DType::bf16).find("(emulated, 1 GPU)") != std::string::npos);
}

TEST_CASE("sweep JSON files: read back whole; past the size or nesting limit an error naming the file and limit") {
  const std::string dir = "/tmp/fp8wire_test_results_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const SweepResult r = synthetic_sweep();
  const std::string good = dir + "/sweep.json";
  std::ofstream(good) << to_json(r, analyze_crossovers(r, {}), calibrate(r)).dump(1);
  std::string error;
  const auto back = read_sweep_file(good, error);
  REQUIRE_MESSAGE(back, error);
  CHECK(back->points.size() == r.points.size());
  // Nested a million deep: nlohmann's parse result would be copied and printed by recursion.
  const std::string deep = dir + "/deep.json";
  std::ofstream(deep) << "{\"points\":" << std::string(1'000'000, '[') << std::string(1'000'000, ']') << "}";
  CHECK(!read_sweep_file(deep, error));
  CHECK(error == "'" + deep + "': line 1, column 266: JSON nested deeper than its limit of 256 levels");
  // Larger than the limit (a sparse file): refused by its size, before anything is read.
  const std::string big = dir + "/big.json";
  std::ofstream(big).close();
  std::filesystem::resize_file(big, kMaxSweepJsonBytes + 1);
  CHECK(!read_sweep_file(big, error));
  CHECK(error == big + ": 268435457 bytes, more than the limit of 268435456 bytes (256 MiB) for a sweep's JSON");
  CHECK(!read_sweep_file(dir + "/missing.json", error));
  CHECK(error == dir + "/missing.json: cannot read: No such file or directory");
  std::filesystem::remove_all(dir);
}

TEST_CASE("an all-to-all sweep: its plain points calibrate all_to_all, its crossover becomes thresholds.all_to_all") {
  // 2 ranks: plain NCCL 25 us + S/2 bus bytes at 8 GB/s; FP8 60 us + S / 30 GB/s (cheaper from ~1.2 MB).
  SweepResult r;
  r.machine.nranks = 2;
  r.machine.fabric = Fabric::net;
  r.codec = {1200.0, 3.0, "test"};
  for (uint64_t bytes = 4096; bytes <= (64u << 20); bytes *= 4) {
    const double b = static_cast<double>(bytes);
    for (const auto& [path, us] : {std::pair{Path::passthrough, 25 + b / 16e3}, std::pair{Path::one_shot, 60 + b / 30e3}}) {
      SweepPoint pt;
      pt.collective = Collective::all_to_all;
      pt.dtype = DType::bf16;
      pt.path = path;
      pt.bytes = bytes;
      pt.count = bytes / 4;  // per peer
      pt.times_us = {us, us * 1.01, us * 0.99, us};
      pt.time = summarize(pt.times_us);
      pt.check.ran = pt.check.pass = true;
      r.points.push_back(pt);
    }
  }
  compute_speedups(r);
  const Calibration cal = calibrate(r);
  CHECK(cal.model.calibrated);
  CHECK(cal.model.alltoall_latency_us == doctest::Approx(25.0).epsilon(1e-6));
  CHECK(cal.model.alltoall_bandwidth_gbps == doctest::Approx(8.0).epsilon(1e-6));
  const FabricProfile p = profile_from_sweep(r, analyze_crossovers(r, {}), cal);
  const auto& a2a = p.thresholds[static_cast<size_t>(Collective::all_to_all)];
  REQUIRE(a2a);
  CHECK(a2a->bytes == (4u << 20));  // the first size measured above the lines' crossing (~1.2 MB)
  CHECK_FALSE(p.thresholds[static_cast<size_t>(Collective::all_reduce)]);
  CHECK(render_profile_toml({p}).find("[thresholds.all_to_all]\nnet = 4194304") != std::string::npos);
}
