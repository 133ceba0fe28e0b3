// Rank launching and bootstrap, POSIX only (no CUDA, no NCCL), so CI tests it with plain processes.
// The one launcher of fp8wire's programs: fp8wire-bench, the transport probe, the trainer and the
// multi-rank GPU tests.
//
// Three ways a rank comes to exist:
//   * local launch (default): the launcher forks one child per visible GPU, or N children on one GPU
//     with --emulate-ranks N, and sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT for
//     each, exactly as torchrun would, and OMP_NUM_THREADS where the environment leaves it unset
//     (omp_threads_per_rank);
//   * torchrun or any launcher that sets those variables (multi-node): the process is one rank;
//   * in both cases rank 0 serves the NCCL unique id over a small TCP exchange on MASTER_ADDR:PORT,
//     listening on that address only, to connections that present the job's secret
//     (FP8WIRE_BOOTSTRAP_SECRET, which the local launcher draws afresh for every launch; under another
//     launcher set it to the same value on every rank, or rank 0 warns that anyone who reaches the
//     port can take a rank's place).
// The launcher reaps every child; when one fails or the deadline passes it kills the others (SIGTERM,
// then SIGKILL after a grace period) and says which rank did what. SIGINT or SIGTERM to the launcher
// goes to every rank; once they are reaped the launcher cleans up and ends by that signal. A rank
// whose launcher dies gets SIGTERM.
// Ranks on one GPU (LaunchSpec::one_gpu) run under a private MPS daemon where one can be started
// (common/mps_daemon.hpp; FP8WIRE_MPS=0 turns it off), and the launcher says which way they ran.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fp8wire {

struct RankEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  // The job's bootstrap secret (kBootstrapSecretDigits hex digits), or empty where none was given.
  std::string secret;
  int local_world_size = 0;  // ranks on this host (LOCAL_WORLD_SIZE); 0: not known
};

// The variable that carries the secret, and its length (32 random bytes in hex).
inline constexpr const char* kBootstrapSecretVariable = "FP8WIRE_BOOTSTRAP_SECRET";
inline constexpr size_t kBootstrapSecretDigits = 64;
// A fresh secret from the kernel's random source (getrandom); empty when none could be had.
std::string make_bootstrap_secret();

// Reads RANK, WORLD_SIZE, LOCAL_RANK (defaults to RANK), LOCAL_WORLD_SIZE, MASTER_ADDR (default
// 127.0.0.1), MASTER_PORT and FP8WIRE_BOOTSTRAP_SECRET. nullopt with error empty: RANK/WORLD_SIZE not
// set (not launched as a rank). nullopt with error set: set but invalid (the message names the
// variable and value; never the secret's value).
std::optional<RankEnv> rank_env_from_environment(std::string& error);

struct LaunchSpec {
  std::vector<std::string> argv;     // argv[0] is the executable path
  int nranks = 1;
  // Extra environment for every child, then per child (index = rank); values override inherited ones.
  std::vector<std::pair<std::string, std::string>> env;
  std::vector<std::vector<std::pair<std::string, std::string>>> env_per_rank;
  double timeout_s = 600;            // whole launch; 0 = no deadline
  double kill_grace_s = 5;           // SIGTERM -> SIGKILL
  // Every rank on one GPU: each gets NCCL_HOSTID=emulated-host-<rank> (NCCL refuses two ranks of
  // one host on one GPU) and the private MPS daemon's environment (FP8WIRE_TESTBED_MODE among it).
  bool one_gpu = false;
  bool quiet = false;                // no line on stderr saying how the ranks share the GPU
};

struct LaunchResult {
  bool ok = false;
  std::string error;                 // which rank failed how, or the timeout
  std::vector<int> exit_codes;       // per rank: exit status, 128+signal, or -1 never reaped
  std::string testbed;               // one_gpu: "mps" or "time-sliced" (FP8WIRE_TESTBED_MODE); else empty
  std::string testbed_note;          // one_gpu: the same in words, with the reason
};

// Starts nranks children with RANK etc. set (MASTER_PORT chosen free on 127.0.0.1, a fresh
// FP8WIRE_BOOTSTRAP_SECRET) and waits.
LaunchResult launch_local_ranks(const LaunchSpec& spec);

// Ranks emulated on one GPU: each must look like a host of its own to NCCL (else it refuses two ranks
// on one GPU), so each gets NCCL_HOSTID=emulated-host-<rank> before its communicator exists. The one
// spelling of that name: LaunchSpec::one_gpu for a launch, or set in the calling rank itself (a rank
// started by another launcher, torchrun).
std::string emulated_host_id(int rank);
void set_emulated_host(int rank);
// Hosts of `ranks_per_host` consecutive ranks each, one GPU per rank (NCCL_HOSTID=standin-host-<k>):
// one machine with 4 or 8 GPUs standing in for a job spanning 2 hosts, NCCL inside each "host" over
// its own transports (NVLink, P2P), between them over sockets.
std::vector<std::vector<std::pair<std::string, std::string>>> host_blocks_env(int nranks, int ranks_per_host);

// OpenMP threads per rank when the launcher's environment does not set OMP_NUM_THREADS: the CPUs
// this process may run on (sched_getaffinity), shared out among `nranks` ranks with half of each
// share left to the threads that are not OpenMP's (the one issuing CUDA work, NCCL's and PyTorch's),
// at least 1. Without it every rank's intra-op pool takes every CPU and its idle threads spin, so
// ranks sharing one machine hold each other's CUDA-issuing threads off the CPUs (torchrun sets 1).
int omp_threads_per_rank(int nranks);

// A TCP port free on every interface right now, below the kernel's ephemeral range where it can
// (ephemeral_port_range), so that no socket the kernel numbers itself takes it before rank 0 binds it.
int find_free_port();
// The kernel's range for ports it hands out itself (/proc/sys/net/ipv4/ip_local_port_range).
std::pair<int, int> ephemeral_port_range();

// Rank 0 listens on master_addr:master_port (that address only) and sends `bytes` of `data` to each
// of the world_size - 1 other ranks; they connect (retrying until timeout) and receive them into
// `data`. Each side proves it holds the job's secret: a rank presents one half of it, rank 0 answers
// with the other half before the data, both compared in constant time. Rank 0 serves connections
// side by side, each with a deadline of kBootstrapHelloSeconds for its request: a connection that
// stays silent, sends anything else or presents another secret is closed without taking a rank's
// place or holding up the others. Returns false with an error naming the address and step that
// failed (and, on rank 0's timeout, the ranks that never came).
inline constexpr double kBootstrapHelloSeconds = 5;
bool exchange_bootstrap_blob(const RankEnv& env, void* data, size_t bytes, double timeout_s, std::string& error);

}  // namespace fp8wire
