#include <doctest/doctest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
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
  const std::string secret = make_bootstrap_secret();
  std::vector<std::thread> threads;
  for (int r = world - 1; r >= 0; --r)  // peers first: they must retry until rank 0 listens
    threads.emplace_back([&, r] {
      RankEnv env{r, world, r, "127.0.0.1", port, secret};
      ok[r] = exchange_bootstrap_blob(env, blobs[r].data(), 128, 10.0, errors[r]);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    CHECK_MESSAGE(ok[r], errors[r]);
    CHECK(std::string(blobs[r].data()) == "nccl-unique-id-bytes");
  }
}

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A client socket connected to addr:port, or -1.
int connect_to(const char* addr, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, addr, &a.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Retries until rank 0 listens (it starts in another thread).
int connect_when_listening(int port) {
  for (int attempt = 0; attempt < 200; ++attempt) {
    if (const int fd = connect_to("127.0.0.1", port); fd >= 0) return fd;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

// Every byte the peer sends until it closes the connection or `seconds` pass.
std::string read_until_closed(int fd, double seconds) {
  std::string got;
  const auto start = Clock::now();
  while (seconds_since(start) < seconds) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    char buf[256];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

// A request in the bootstrap's format (common/rank_launcher.cpp) with the given secret half.
std::string request(int rank, const std::string& first_half) {
  std::string hello = "FP8WBOOT";
  for (int i = 0; i < 4; ++i) hello.push_back(static_cast<char>((rank >> (8 * i)) & 0xFF));
  return hello + first_half;
}
}  // namespace

TEST_CASE("bootstrap: stray connections get nothing, take no rank's place and hold up no one") {
  const int port = find_free_port();
  REQUIRE(port > 0);
  const int world = 3;
  const std::string secret = make_bootstrap_secret();
  REQUIRE(secret.size() == kBootstrapSecretDigits);
  std::string other = make_bootstrap_secret();
  REQUIRE(other != secret);
  std::array<char, 128> blob{};
  std::strcpy(blob.data(), "nccl-unique-id-bytes");
  bool rank0_ok = false;
  std::string rank0_error;
  const auto start = Clock::now();
  std::thread rank0([&] {
    RankEnv env{0, world, 0, "127.0.0.1", port, secret};
    rank0_ok = exchange_bootstrap_blob(env, blob.data(), blob.size(), 30.0, rank0_error);
  });
  // Before any real rank: the old one-byte request, a silent connection, a request with another
  // job's secret, and a flood of idle connections beyond the number rank 0 keeps waiting.
  const int one_byte = connect_when_listening(port);
  REQUIRE(one_byte >= 0);
  CHECK(::send(one_byte, "F", 1, 0) == 1);
  const int silent = connect_to("127.0.0.1", port);
  const int wrong = connect_to("127.0.0.1", port);
  REQUIRE(silent >= 0);
  REQUIRE(wrong >= 0);
  const std::string wrong_request = request(1, other.substr(0, kBootstrapSecretDigits / 2));
  CHECK(::send(wrong, wrong_request.data(), wrong_request.size(), 0) == static_cast<ssize_t>(wrong_request.size()));
  std::vector<int> flood;
  for (int i = 0; i < 80; ++i) flood.push_back(connect_to("127.0.0.1", port));
  // The stray with the wrong secret is closed at once, with nothing sent.
  CHECK(read_until_closed(wrong, 3).empty());

  // The real ranks come up promptly: well within the per-connection deadline the silent ones hold.
  std::vector<std::array<char, 128>> blobs(world);
  std::vector<std::string> errors(world);
  std::vector<int> ok(world, 0);
  const auto ranks_start = Clock::now();
  std::vector<std::thread> ranks;
  for (int r = 1; r < world; ++r)
    ranks.emplace_back([&, r] {
      RankEnv env{r, world, r, "127.0.0.1", port, secret};
      ok[r] = exchange_bootstrap_blob(env, blobs[r].data(), 128, 30.0, errors[r]);
    });
  for (auto& t : ranks) t.join();
  rank0.join();
  const double ranks_took = seconds_since(ranks_start);
  CHECK_MESSAGE(rank0_ok, rank0_error);
  for (int r = 1; r < world; ++r) {
    CHECK_MESSAGE(ok[r], errors[r]);
    CHECK(std::string(blobs[r].data()) == "nccl-unique-id-bytes");
  }
  CHECK(ranks_took < kBootstrapHelloSeconds / 2);
  CHECK(seconds_since(start) < 10);
  // Every stray got nothing: rank 0 closed them all when it was done (or earlier).
  for (int fd : {one_byte, silent}) CHECK(read_until_closed(fd, 3).empty());
  for (int fd : flood)
    if (fd >= 0) CHECK(read_until_closed(fd, 3).empty());
  for (int fd : flood)
    if (fd >= 0) ::close(fd);
  for (int fd : {one_byte, silent, wrong}) ::close(fd);
}

namespace {
// Rank 0 of a world of two, serving "id" on 127.0.0.1 from a thread of its own; each rank stands in
// for a host (LOCAL_WORLD_SIZE 1), as tests/pylib/emulated_launch.py starts them.
struct ServingRank0 {
  int port = find_free_port();
  std::string secret = make_bootstrap_secret();
  std::array<char, 16> blob{'i', 'd'};
  bool ok = false;
  std::string error;
  std::thread thread{[this] {
    RankEnv env{0, 2, 0, "127.0.0.1", port, secret, 1};
    ok = exchange_bootstrap_blob(env, blob.data(), blob.size(), 30.0, error);
  }};
  // Rank 1 takes the blob with the job's secret; both sides must succeed.
  void serve_rank1() {
    std::array<char, 16> got{};
    std::string rank1_error;
    RankEnv env{1, 2, 1, "127.0.0.1", port, secret};
    CHECK_MESSAGE(exchange_bootstrap_blob(env, got.data(), got.size(), 10.0, rank1_error), rank1_error);
    thread.join();
    CHECK_MESSAGE(ok, error);
    CHECK(std::string(got.data()) == "id");
  }
  ~ServingRank0() {
    if (thread.joinable()) thread.join();
  }
};
}  // namespace

TEST_CASE("bootstrap: a silent connection is dropped at its deadline, and rank 0 keeps serving") {
  ServingRank0 rank0;
  const int silent = connect_when_listening(rank0.port);
  REQUIRE(silent >= 0);
  const auto start = Clock::now();
  CHECK(read_until_closed(silent, kBootstrapHelloSeconds + 5).empty());
  const double held = seconds_since(start);
  CHECK(held > kBootstrapHelloSeconds - 1);
  CHECK(held < kBootstrapHelloSeconds + 2);
  ::close(silent);
  rank0.serve_rank1();
}

TEST_CASE("bootstrap: rank 0 listens on MASTER_ADDR only") {
  ServingRank0 rank0;
  const int fd = connect_when_listening(rank0.port);
  REQUIRE(fd >= 0);
  ::close(fd);
  // 127.0.0.2 is this host too (all of 127/8 is loopback): listening on every interface would
  // accept it.
  CHECK(connect_to("127.0.0.2", rank0.port) < 0);
  rank0.serve_rank1();
}

TEST_CASE("bootstrap: a rank with another secret is refused, and says which variable to check") {
  const int port = find_free_port();
  std::array<char, 16> blob{};
  std::string rank0_error;
  std::thread rank0([&] {
    RankEnv env{0, 2, 0, "127.0.0.1", port, make_bootstrap_secret()};
    CHECK_FALSE(exchange_bootstrap_blob(env, blob.data(), blob.size(), 1.5, rank0_error));
  });
  std::array<char, 16> got{};
  std::string error;
  RankEnv env{1, 2, 1, "127.0.0.1", port, make_bootstrap_secret()};
  CHECK_FALSE(exchange_bootstrap_blob(env, got.data(), got.size(), 1.0, error));
  rank0.join();
  CHECK(error.find("FP8WIRE_BOOTSTRAP_SECRET the same on every rank") != std::string::npos);
  CHECK(rank0_error.find("saw 0 of 1 ranks") != std::string::npos);
  CHECK(rank0_error.find("(missing: 1)") != std::string::npos);
}

TEST_CASE("bootstrap: a program on the port that does not hold the secret gets nothing the ranks trust") {
  const int port = find_free_port();
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  REQUIRE(::listen(listener, 4) == 0);
  std::thread impostor([&] {
    const int peer = ::accept(listener, nullptr, nullptr);
    char hello[44];
    size_t got = 0;
    while (got < sizeof(hello)) {
      const ssize_t n = ::recv(peer, hello + got, sizeof(hello) - got, 0);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    const std::string reply(32 + 16, 'x');
    ::send(peer, reply.data(), reply.size(), 0);
    ::close(peer);
  });
  std::array<char, 16> got{};
  std::string error;
  RankEnv env{1, 2, 1, "127.0.0.1", port, make_bootstrap_secret()};
  CHECK_FALSE(exchange_bootstrap_blob(env, got.data(), got.size(), 5.0, error));
  impostor.join();
  ::close(listener);
  CHECK(error.find("answered without this job's secret") != std::string::npos);
  CHECK(std::string(got.data(), 1) == std::string(1, '\0'));  // nothing of the impostor's written
}

TEST_CASE("bootstrap: a host name that resolves to loopback for ranks on several hosts is an error, not a timeout") {
  RankEnv env{0, 4, 0, "localhost", find_free_port(), make_bootstrap_secret(), 2};
  std::array<char, 16> blob{};
  std::string error;
  const auto start = Clock::now();
  CHECK_FALSE(exchange_bootstrap_blob(env, blob.data(), blob.size(), 10.0, error));
  CHECK(seconds_since(start) < 1);
  CHECK(error.find("bootstrap: rank 0 cannot listen on MASTER_ADDR 'localhost' port ") == 0);
  CHECK(error.find("it resolves to 127.0.0.1 on this host, a loopback address, which the ranks on other hosts "
                   "(WORLD_SIZE 4, LOCAL_WORLD_SIZE 2) cannot reach") != std::string::npos);
  // The literal address is a choice: ranks standing in for hosts on one machine.
  ServingRank0 rank0;
  rank0.serve_rank1();
}

TEST_CASE("launcher: every rank of a launch gets the same fresh bootstrap secret") {
  char dir_template[] = "/tmp/fp8wire-secret-XXXXXX";
  REQUIRE(::mkdtemp(dir_template));
  const std::string dir = dir_template;
  auto secrets_of_launch = [&](const std::string& tag) {
    const LaunchResult res = launch_local_ranks(
        shell("printf %s \"$FP8WIRE_BOOTSTRAP_SECRET\" > " + dir + "/" + tag + "$RANK", 2));
    CHECK_MESSAGE(res.ok, res.error);
    std::set<std::string> seen;
    for (int r = 0; r < 2; ++r) {
      std::ifstream in(dir + "/" + tag + std::to_string(r));
      std::string text((std::istreambuf_iterator<char>(in)), {});
      CHECK(text.size() == kBootstrapSecretDigits);
      CHECK(text.find_first_not_of("0123456789abcdef") == std::string::npos);
      seen.insert(text);
      std::remove((dir + "/" + tag + std::to_string(r)).c_str());
    }
    CHECK(seen.size() == 1);
    return *seen.begin();
  };
  CHECK(secrets_of_launch("a") != secrets_of_launch("b"));
  ::rmdir(dir.c_str());
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
  setenv("MASTER_PORT", "29500", 1);
  unsetenv("FP8WIRE_BOOTSTRAP_SECRET");
  CHECK(rank_env_from_environment(error)->secret.empty());
  const std::string secret = make_bootstrap_secret();
  setenv("FP8WIRE_BOOTSTRAP_SECRET", secret.c_str(), 1);
  CHECK(rank_env_from_environment(error)->secret == secret);
  setenv("FP8WIRE_BOOTSTRAP_SECRET", "hunter2", 1);
  CHECK_FALSE(rank_env_from_environment(error));
  CHECK(error == "FP8WIRE_BOOTSTRAP_SECRET: expected 64 hex digits (e.g. from `openssl rand -hex 32`), got 7 "
                 "character(s) with some that are not hex digits");
  CHECK(error.find("hunter2") == std::string::npos);  // a secret is never echoed
  unsetenv("FP8WIRE_BOOTSTRAP_SECRET");
  setenv("LOCAL_WORLD_SIZE", "3", 1);
  CHECK_FALSE(rank_env_from_environment(error));
  CHECK(error == "LOCAL_WORLD_SIZE='3': expected an integer in [1, WORLD_SIZE=2]");
  setenv("LOCAL_WORLD_SIZE", "1", 1);
  CHECK(rank_env_from_environment(error)->local_world_size == 1);
  for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR", "LOCAL_WORLD_SIZE"}) unsetenv(v);
}
