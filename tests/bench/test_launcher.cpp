#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/rank_launcher.hpp"

using namespace fp8wire;

namespace {
LaunchSpec shell(const std::string& script, int nranks, double timeout_s = 20) {
  LaunchSpec spec;
  spec.argv = {"/bin/sh", "-c", script};
  spec.nranks = nranks;
  spec.timeout_s = timeout_s;
  spec.kill_grace_s = 1;
  return spec;
}
}  // namespace

TEST_CASE("launcher sets torchrun variables and reaps every child") {
  LaunchSpec spec = shell("test \"$WORLD_SIZE\" = 3 && test \"$RANK\" = \"$LOCAL_RANK\" && test -n \"$MASTER_PORT\" "
                          "&& test \"$NCCL_HOSTID\" = \"emulated-host-$RANK\" && test \"$EXTRA\" = yes", 3);
  spec.env = {{"EXTRA", "yes"}};
  for (int r = 0; r < 3; ++r) spec.env_per_rank.push_back({{"NCCL_HOSTID", "emulated-host-" + std::to_string(r)}});
  const LaunchResult res = launch_local_ranks(spec);
  CHECK_MESSAGE(res.ok, res.error);
  CHECK(res.exit_codes == std::vector<int>{0, 0, 0});
}

TEST_CASE("ranks share the CPUs out by OMP_NUM_THREADS, unless the environment sets it") {
  const char* before = std::getenv("OMP_NUM_THREADS");
  const std::string saved = before ? before : "";
  ::unsetenv("OMP_NUM_THREADS");
  const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  const int share = omp_threads_per_rank(2);
  CHECK(share >= 1);
  CHECK(share <= std::max(1L, cpus / 2));
  CHECK(omp_threads_per_rank(1000000) == 1);
  LaunchResult res = launch_local_ranks(shell("test \"$OMP_NUM_THREADS\" = " + std::to_string(share), 2));
  CHECK_MESSAGE(res.ok, res.error);
  res = launch_local_ranks(shell("test -z \"$OMP_NUM_THREADS\"", 1));  // one rank: OpenMP's own default
  CHECK_MESSAGE(res.ok, res.error);
  ::setenv("OMP_NUM_THREADS", "3", 1);
  res = launch_local_ranks(shell("test \"$OMP_NUM_THREADS\" = 3", 2));
  CHECK_MESSAGE(res.ok, res.error);
  if (before) ::setenv("OMP_NUM_THREADS", saved.c_str(), 1);
  else ::unsetenv("OMP_NUM_THREADS");
}

TEST_CASE("a failing rank stops the others quickly and is named") {
  const auto start = std::chrono::steady_clock::now();
  const LaunchResult res = launch_local_ranks(shell("if [ \"$RANK\" = 1 ]; then exit 3; fi; exec sleep 30", 2));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK_FALSE(res.ok);
  CHECK(res.error.find("rank 1 exited with code 3") != std::string::npos);
  CHECK(res.exit_codes[1] == 3);
  CHECK(res.exit_codes[0] == 128 + 15);  // SIGTERM
  CHECK(took < 10);
}

TEST_CASE("a hung launch times out, is killed and says which ranks hung") {
  const LaunchResult res = launch_local_ranks(shell("if [ \"$RANK\" = 0 ]; then exit 0; fi; exec sleep 30", 2, 0.5));
  CHECK_FALSE(res.ok);
  CHECK(res.error.find("timeout") != std::string::npos);
  CHECK(res.error.find("rank(s) 1") != std::string::npos);
  CHECK(res.exit_codes[0] == 0);
}

TEST_CASE("an executable that does not exist is reported") {
  LaunchSpec spec;
  spec.argv = {"/nonexistent/fp8wire-bench"};
  spec.nranks = 2;
  spec.kill_grace_s = 1;
  const LaunchResult res = launch_local_ranks(spec);
  CHECK_FALSE(res.ok);
  CHECK(res.error.find("could not exec") != std::string::npos);
}

TEST_CASE("the bootstrap port is free and below the kernel's ephemeral range, which any socket may be given") {
  const auto [low, high] = ephemeral_port_range();
  REQUIRE(0 < low);
  REQUIRE(low <= high);
  for (int i = 0; i < 20; ++i) {
    const int port = find_free_port();
    REQUIRE(port > 0);
    if (low > 21000) CHECK(port < low);  // Linux's default range starts at 32768
    // Free: rank 0 binds it as the launcher's ranks will.
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    CHECK(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    ::close(fd);
  }
}

TEST_CASE("TCP bootstrap hands rank 0's blob to every rank") {
  const int port = find_free_port();
  REQUIRE(port > 0);
  const int world = 4;
  std::vector<std::array<char, 128>> blobs(world);
  std::vector<std::string> errors(world);
  std::vector<int> ok(world, 0);
  std::memset(blobs[0].data(), 0, 128);
  std::strcpy(blobs[0].data(), "nccl-unique-id-bytes");
  std::vector<std::thread> threads;
  for (int r = world - 1; r >= 0; --r)  // peers first: they must retry until rank 0 listens
    threads.emplace_back([&, r] {
      RankEnv env{r, world, r, "127.0.0.1", port};
      ok[r] = exchange_bootstrap_blob(env, blobs[r].data(), 128, 10.0, errors[r]);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    CHECK_MESSAGE(ok[r], errors[r]);
    CHECK(std::string(blobs[r].data()) == "nccl-unique-id-bytes");
  }
}

TEST_CASE("bootstrap without rank 0 fails within the timeout with a clear error") {
  RankEnv env{1, 2, 1, "127.0.0.1", find_free_port()};
  char blob[16];
  std::string error;
  CHECK_FALSE(exchange_bootstrap_blob(env, blob, sizeof(blob), 0.3, error));
  CHECK(error.find("could not get the NCCL id from rank 0 at 127.0.0.1") != std::string::npos);
}

TEST_CASE("rank environment: absent, valid, invalid") {
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  std::string error;
  CHECK_FALSE(rank_env_from_environment(error));
  CHECK(error.empty());
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("MASTER_PORT", "29500", 1);
  setenv("MASTER_ADDR", "node0", 1);
  unsetenv("LOCAL_RANK");
  auto env = rank_env_from_environment(error);
  REQUIRE(env);
  CHECK(env->rank == 1);
  CHECK(env->local_rank == 1);
  CHECK(env->master_addr == "node0");
  CHECK(env->master_port == 29500);
  setenv("RANK", "2", 1);
  CHECK_FALSE(rank_env_from_environment(error));
  CHECK(error.find("RANK='2'") != std::string::npos);
  setenv("RANK", "0", 1);
  setenv("MASTER_PORT", "http", 1);
  CHECK_FALSE(rank_env_from_environment(error));
  CHECK(error.find("MASTER_PORT='http'") != std::string::npos);
  for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR"}) unsetenv(v);
}
