// Ranks emulated on one GPU run their kernels side by side only under an MPS daemon; without one the
// GPU time-slices between their processes, and every figure measured there is the slicing's, not the
// code's. A launcher of emulated ranks owns one private daemon for the life of the launch:
//   * its own pipe and log directories (a fresh temporary directory), so a daemon the user runs, on
//     the default pipe directory or any other, is never contacted, started or stopped;
//   * started with `nvidia-cuda-mps-control -d` when that program is on PATH, stopped with `quit`
//     when the owner is destroyed (the launcher also stops it when interrupted by SIGINT/SIGTERM);
//   * FP8WIRE_MPS=0 turns it off (the ranks are then time-sliced); so does a missing program, and a
//     daemon that fails to start, each saying so.
// The ranks get CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY (they become clients of this
// daemon) and FP8WIRE_TESTBED_MODE=mps or time-sliced, which results files carry. A launcher inside a
// rank of another (a script under the main job) finds FP8WIRE_TESTBED_MODE=mps with the pipe
// directory set and joins that daemon instead of starting a second one.
// POSIX only; the same protocol is implemented by tests/pylib/emulated_launch.py and scripts/gpu/lib.sh.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace fp8wire {

// The values of FP8WIRE_TESTBED_MODE.
inline constexpr const char* kTestbedMps = "mps";
inline constexpr const char* kTestbedTimeSliced = "time-sliced";

class PrivateMps {
 public:
  // Starts the daemon (or joins the enclosing launcher's, or decides on time slicing, see above).
  PrivateMps();
  ~PrivateMps();  // stops a daemon this object started
  PrivateMps(const PrivateMps&) = delete;
  PrivateMps& operator=(const PrivateMps&) = delete;

  // Stops the daemon now (idempotent; the destructor calls it).
  void stop();

  bool side_by_side() const { return mode_ == kTestbedMps; }
  const std::string& mode() const { return mode_; }  // kTestbedMps or kTestbedTimeSliced
  // One line for the launcher's output: "ranks side by side under a private MPS daemon (...)" or
  // "time-sliced (why)".
  std::string describe() const;
  // What every rank's environment needs.
  std::vector<std::pair<std::string, std::string>> rank_env() const;

 private:
  std::string mode_ = kTestbedTimeSliced;
  std::string why_;        // time-sliced: the reason; mps: whose daemon
  std::string dir_;        // the temporary directory this object made (empty: none)
  std::string pipe_dir_, log_dir_;
  std::string control_;    // the nvidia-cuda-mps-control that started it
  bool owned_ = false;     // started here, so stopped here
};

}  // namespace fp8wire
