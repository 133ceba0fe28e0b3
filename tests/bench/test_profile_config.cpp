// The profile fp8wire-bench writes must load as the shim's configuration, key for key.
#include <doctest/doctest.h>

#include "bench/host/profile.hpp"
#include "common/config.hpp"

using namespace fp8wire;
using namespace fp8wire::bench;

TEST_CASE("profile round trip through parse_config_toml") {
  FabricProfile pcie;
  pcie.fabric = Fabric::pcie;
  pcie.source = "synthetic";
  pcie.thresholds[0] = ThresholdEntry{767u * 1024u, "bf16: 1.10x"};
  pcie.thresholds[2] = ThresholdEntry{kNeverThreshold, "never"};
  pcie.cost_model = CostModel{.op_latency_us = 27.5, .bus_bandwidth_gbps = 21.25, .codec_gbps = 1500.0,
                               .kernel_launch_us = 3.5, .calibrated = true};
  FabricProfile net;
  net.fabric = Fabric::net;
  net.thresholds[0] = ThresholdEntry{4u << 20, ""};
  net.thresholds[1] = ThresholdEntry{2u << 20, ""};
  net.thresholds[3] = ThresholdEntry{3u << 20, "bf16: 1.40x"};  // all_to_all
  net.thresholds[4] = ThresholdEntry{5u << 20, "bf16: 1.20x"};  // send_recv

  const std::string toml = render_profile_toml({pcie, net});
  const ConfigResult r = parse_config_toml(toml, "profile.toml");
  for (const auto& e : r.errors) MESSAGE(e.message());
  REQUIRE(r.ok());
  const Config& c = r.config;
  const Config defaults;
  CHECK(c.thresholds[0][static_cast<int>(Fabric::pcie)] == 767u * 1024u);
  CHECK(c.thresholds[2][static_cast<int>(Fabric::pcie)] == kNeverThreshold);
  CHECK(c.thresholds[0][static_cast<int>(Fabric::net)] == (4u << 20));
  CHECK(c.thresholds[1][static_cast<int>(Fabric::net)] == (2u << 20));
  CHECK(c.thresholds[static_cast<int>(Collective::all_to_all)][static_cast<int>(Fabric::net)] == (3u << 20));
  CHECK(toml.find("[thresholds.all_to_all]\nnet = 3145728") != std::string::npos);
  CHECK(c.thresholds[static_cast<int>(Collective::send_recv)][static_cast<int>(Fabric::net)] == (5u << 20));
  CHECK(toml.find("[thresholds.send_recv]\nnet = 5242880") != std::string::npos);
  // Keys the profile does not name keep their defaults.
  CHECK(c.thresholds[0][static_cast<int>(Fabric::nvlink)] == defaults.thresholds[0][static_cast<int>(Fabric::nvlink)]);
  CHECK(c.thresholds[1][static_cast<int>(Fabric::pcie)] == defaults.thresholds[1][static_cast<int>(Fabric::pcie)]);
  const CostModel& m = c.cost_model[static_cast<int>(Fabric::pcie)];
  CHECK(m.calibrated);
  CHECK(m.op_latency_us == doctest::Approx(27.5));
  CHECK(m.bus_bandwidth_gbps == doctest::Approx(21.25));
  CHECK(m.codec_gbps == doctest::Approx(1500.0));
  CHECK(m.kernel_launch_us == doctest::Approx(3.5));
  CHECK_FALSE(c.cost_model[static_cast<int>(Fabric::net)].calibrated);
}

TEST_CASE("profile pins the gather transport its sweep measured, and only that") {
  auto sweep_with = [](std::vector<std::string> transports) {
    SweepResult r;
    r.machine.nranks = 4;
    r.machine.fabric = Fabric::net;
    uint64_t bytes = 1 << 20;
    for (const auto& t : transports) {
      SweepPoint plain;
      plain.path = Path::passthrough;
      plain.bytes = bytes;
      r.points.push_back(plain);
      SweepPoint fp8;
      fp8.path = Path::one_shot;
      fp8.bytes = bytes;
      fp8.gather_transport = t;
      r.points.push_back(fp8);
      bytes *= 4;
    }
    return profile_from_sweep(r, {}, Calibration{});
  };
  auto loaded = [](const FabricProfile& p) {
    const ConfigResult r = parse_config_toml(render_profile_toml({p}), "profile.toml");
    for (const auto& e : r.errors) MESSAGE(e.message());
    REQUIRE(r.ok());
    return r.config.gather_transport;
  };
  CHECK(sweep_with({"sendrecv", "sendrecv"}).gather_transport == "sendrecv");
  CHECK(loaded(sweep_with({"sendrecv", "sendrecv"})) == GatherMethod::sendrecv);
  CHECK(loaded(sweep_with({"allgather"})) == GatherMethod::allgather);
  // Both measured (a --gather-transport both sweep), or a rank disagreeing: the automatic choice.
  CHECK(sweep_with({"allgather", "sendrecv"}).gather_transport.empty());
  CHECK(loaded(sweep_with({"allgather", "sendrecv"})) == GatherMethod::automatic);
  CHECK(loaded(sweep_with({"mixed"})) == GatherMethod::automatic);
  // Fabrics of one document that disagree: the key (one for all fabrics) is left out.
  FabricProfile a = sweep_with({"sendrecv"}), b = sweep_with({"allgather"});
  b.fabric = Fabric::pcie;
  const ConfigResult r = parse_config_toml(render_profile_toml({a, b}), "profile.toml");
  REQUIRE(r.ok());
  CHECK(r.config.gather_transport == GatherMethod::automatic);
}
