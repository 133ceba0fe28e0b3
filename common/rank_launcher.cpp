#include "common/rank_launcher.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "common/mps_daemon.hpp"

extern char** environ;

namespace fp8wire {

namespace {

std::optional<long> parse_long(const char* text) {
  if (!text || !*text) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text, &end, 10);
  if (errno || *end) return std::nullopt;
  return v;
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return "ended";
}

int code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

bool send_all(int fd, const void* data, size_t bytes) {
  const auto* p = static_cast<const char*>(data);
  while (bytes) {
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

// Receives exactly `bytes`, giving up at the deadline.
bool recv_all(int fd, void* data, size_t bytes, Clock::time_point deadline) {
  auto* p = static_cast<char*>(data);
  while (bytes) {
    const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, static_cast<int>(left * 1000) + 1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return false;
    const ssize_t n = ::recv(fd, p, bytes, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

// SIGINT/SIGTERM to the launcher while ranks run: recorded here, forwarded by the wait loop.
volatile sig_atomic_t g_stop_signal = 0;
void note_stop_signal(int sig) { g_stop_signal = sig; }

// Installs the handlers for one launch and puts the previous ones back.
struct StopSignals {
  struct sigaction old_int{}, old_term{};
  StopSignals() {
    g_stop_signal = 0;
    struct sigaction sa{};
    sa.sa_handler = note_stop_signal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, &old_int);
    ::sigaction(SIGTERM, &sa, &old_term);
  }
  ~StopSignals() {
    ::sigaction(SIGINT, &old_int, nullptr);
    ::sigaction(SIGTERM, &old_term, nullptr);
  }
};

}  // namespace

std::optional<RankEnv> rank_env_from_environment(std::string& error) {
  error.clear();
  const char* rank_s = std::getenv("RANK");
  const char* world_s = std::getenv("WORLD_SIZE");
  if (!rank_s && !world_s) return std::nullopt;
  RankEnv env;
  const auto rank = parse_long(rank_s);
  const auto world = parse_long(world_s);
  if (!world || *world < 1) {
    error = fmt::format("WORLD_SIZE='{}': expected an integer >= 1", world_s ? world_s : "");
    return std::nullopt;
  }
  if (!rank || *rank < 0 || *rank >= *world) {
    error = fmt::format("RANK='{}': expected an integer in [0, WORLD_SIZE={})", rank_s ? rank_s : "", *world);
    return std::nullopt;
  }
  env.rank = static_cast<int>(*rank);
  env.world_size = static_cast<int>(*world);
  const char* local_s = std::getenv("LOCAL_RANK");
  if (local_s) {
    const auto local = parse_long(local_s);
    if (!local || *local < 0) {
      error = fmt::format("LOCAL_RANK='{}': expected an integer >= 0", local_s);
      return std::nullopt;
    }
    env.local_rank = static_cast<int>(*local);
  } else {
    env.local_rank = env.rank;
  }
  if (const char* addr = std::getenv("MASTER_ADDR"); addr && *addr) env.master_addr = addr;
  const char* port_s = std::getenv("MASTER_PORT");
  const auto port = parse_long(port_s);
  if (env.world_size > 1 && (!port || *port < 1 || *port > 65535)) {
    error = fmt::format("MASTER_PORT='{}': expected a TCP port in [1, 65535]", port_s ? port_s : "");
    return std::nullopt;
  }
  env.master_port = port ? static_cast<int>(*port) : 0;
  return env;
}

std::vector<std::vector<std::pair<std::string, std::string>>> host_blocks_env(int nranks, int ranks_per_host) {
  std::vector<std::vector<std::pair<std::string, std::string>>> env;
  for (int r = 0; r < nranks; ++r)
    env.push_back({{"NCCL_HOSTID", fmt::format("standin-host-{}", r / (ranks_per_host > 0 ? ranks_per_host : 1))}});
  return env;
}

std::string emulated_host_id(int rank) { return fmt::format("emulated-host-{}", rank); }

void set_emulated_host(int rank) { ::setenv("NCCL_HOSTID", emulated_host_id(rank).c_str(), 1); }

std::pair<int, int> ephemeral_port_range() {
  int low = 32768, high = 60999;  // Linux's default
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    int a = 0, b = 0;
    if (std::fscanf(f, "%d %d", &a, &b) == 2 && a > 0 && a <= b && b <= 65535) low = a, high = b;
    std::fclose(f);
  }
  return {low, high};
}

namespace {
// Whether `port` can be bound on every interface (as rank 0 binds it) right now; 0: any free
// port, which *bound receives.
bool bindable(int port, int* bound = nullptr) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  if (ok && bound) *bound = ntohs(addr.sin_port);
  ::close(fd);
  return ok;
}
}  // namespace

int find_free_port() {
  // Below the kernel's ephemeral range: a port from that range (what a bind to port 0 returns) is
  // handed to other sockets too, NCCL's among them and every outgoing connection, and was seen
  // taken between this probe and rank 0's bind. One below it is only ever taken on purpose.
  const auto [low, high] = ephemeral_port_range();
  constexpr int kLowest = 20000;  // clear of the registered services most machines run
  if (low - 1 > kLowest + 1000) {
    std::mt19937 rng(std::random_device{}());
    std::uniform_int_distribution<int> pick(kLowest, low - 1);
    for (int attempt = 0; attempt < 64; ++attempt) {
      const int port = pick(rng);
      if (port != 29500 && bindable(port)) return port;  // 29500: torchrun's default
    }
  }
  int port = 0;
  return bindable(0, &port) ? port : 0;
}

int omp_threads_per_rank(int nranks) {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cpus = ::sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set)
                                                                  : static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  return std::max(1, cpus / (2 * std::max(nranks, 1)));
}

namespace {

LaunchResult launch_and_wait(const LaunchSpec& spec, const std::vector<std::pair<std::string, std::string>>& shared_env) {
  LaunchResult result;
  result.exit_codes.assign(static_cast<size_t>(std::max(spec.nranks, 0)), -1);
  if (spec.argv.empty() || spec.nranks < 1) {
    result.error = "launch: nothing to run (empty argv or nranks < 1)";
    return result;
  }
  const int port = find_free_port();
  if (port == 0) {
    result.error = "launch: could not find a free TCP port on 127.0.0.1 for MASTER_PORT";
    return result;
  }

  std::vector<pid_t> pids(static_cast<size_t>(spec.nranks), -1);
  auto kill_all = [&](int sig) {
    for (pid_t pid : pids)
      if (pid > 0) ::kill(pid, sig);
  };
  for (int r = 0; r < spec.nranks; ++r) {
    // Everything the child needs is built before fork: only async-signal-safe calls after it.
    std::vector<std::pair<std::string, std::string>> vars = {
        {"RANK", std::to_string(r)},          {"WORLD_SIZE", std::to_string(spec.nranks)},
        {"LOCAL_RANK", std::to_string(r)},    {"LOCAL_WORLD_SIZE", std::to_string(spec.nranks)},
        {"MASTER_ADDR", "127.0.0.1"},         {"MASTER_PORT", std::to_string(port)}};
    for (const auto& kv : shared_env) vars.push_back(kv);
    if (spec.one_gpu) vars.push_back({"NCCL_HOSTID", emulated_host_id(r)});
    for (const auto& kv : spec.env) vars.push_back(kv);
    if (static_cast<size_t>(r) < spec.env_per_rank.size())
      for (const auto& kv : spec.env_per_rank[static_cast<size_t>(r)]) vars.push_back(kv);
    std::vector<std::string> env_strings;
    for (char** e = environ; *e; ++e) {
      const std::string entry(*e);
      const std::string name = entry.substr(0, entry.find('='));
      bool overridden = false;
      for (const auto& kv : vars) overridden |= (kv.first == name);
      if (!overridden) env_strings.push_back(entry);
    }
    for (const auto& kv : vars) env_strings.push_back(kv.first + "=" + kv.second);
    std::vector<char*> envp, argv;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = spec.argv;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);

    const pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // a launcher killed outright takes its ranks with it
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);  // exec failed
    }
    if (pid < 0) {
      result.error = fmt::format("launch: fork for rank {} failed: {}", r, strerror(errno));
      kill_all(SIGKILL);
      for (pid_t p : pids)
        if (p > 0) ::waitpid(p, nullptr, 0);
      return result;
    }
    pids[static_cast<size_t>(r)] = pid;
  }

  const auto start = Clock::now();
  int running = spec.nranks;
  bool killing = false;
  Clock::time_point kill_time{};
  while (running > 0) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (int r = 0; r < spec.nranks; ++r) {
        if (pids[static_cast<size_t>(r)] != pid) continue;
        pids[static_cast<size_t>(r)] = -1;
        result.exit_codes[static_cast<size_t>(r)] = code_of(status);
        --running;
        const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (failed && !killing) {
          result.error = fmt::format("rank {} {}{}; stopping the other ranks", r, describe_status(status),
                                     WIFEXITED(status) && WEXITSTATUS(status) == 127 ? " (could not exec " + spec.argv[0] + ")" : "");
          killing = true;
          kill_time = Clock::now();
          kill_all(SIGTERM);
        }
      }
      continue;
    }
    if (pid < 0 && errno != EINTR) break;  // no children left
    if (g_stop_signal && !killing) {
      result.error = fmt::format("the launcher got signal {} ({}); stopping every rank", int(g_stop_signal),
                                 strsignal(g_stop_signal));
      killing = true;
      kill_time = Clock::now();
      kill_all(SIGTERM);
    }
    if (!killing && spec.timeout_s > 0 && seconds_since(start) > spec.timeout_s) {
      std::string hung;
      for (int r = 0; r < spec.nranks; ++r)
        if (pids[static_cast<size_t>(r)] > 0) hung += (hung.empty() ? "" : ", ") + std::to_string(r);
      result.error = fmt::format("timeout after {:.0f} s (--timeout): rank(s) {} still running; killed", spec.timeout_s, hung);
      killing = true;
      kill_time = Clock::now();
      kill_all(SIGTERM);
    }
    if (killing && seconds_since(kill_time) > spec.kill_grace_s) kill_all(SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  result.ok = !killing && result.error.empty();
  return result;
}

}  // namespace

LaunchResult launch_local_ranks(const LaunchSpec& spec) {
  LaunchResult result;
  int stop_signal = 0;
  {
    StopSignals signals;
    std::optional<PrivateMps> mps;
    std::vector<std::pair<std::string, std::string>> shared_env;
    // The user's OMP_NUM_THREADS stands; a single rank keeps OpenMP's own default.
    const int omp_threads = std::getenv("OMP_NUM_THREADS") || spec.nranks < 2 ? 0 : omp_threads_per_rank(spec.nranks);
    if (omp_threads) shared_env.push_back({"OMP_NUM_THREADS", std::to_string(omp_threads)});
    const std::string threads_note =
        omp_threads ? fmt::format("; OMP_NUM_THREADS={} per rank (unset here)", omp_threads) : std::string();
    if (spec.one_gpu && spec.nranks > 0 && !spec.argv.empty()) {
      mps.emplace();
      for (auto& kv : mps->rank_env()) shared_env.push_back(kv);
      if (!spec.quiet)
        std::fprintf(stderr, "fp8wire launcher: %d ranks on one GPU, %s%s\n", spec.nranks, mps->describe().c_str(),
                     threads_note.c_str());
    }
    result = launch_and_wait(spec, shared_env);
    if (mps) {
      result.testbed = mps->mode();
      result.testbed_note = mps->describe();
    }
    stop_signal = g_stop_signal;
  }  // the daemon stops and the previous signal handlers return here
  // Interrupted: end the way an uninterrupted process would have, by that signal.
  if (stop_signal) ::raise(stop_signal);
  return result;
}

bool exchange_bootstrap_blob(const RankEnv& env, void* data, size_t bytes, double timeout_s, std::string& error) {
  if (env.world_size <= 1) return true;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  const std::string where = fmt::format("{}:{}", env.master_addr, env.master_port);

  if (env.rank == 0) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);  // peers on other nodes connect to MASTER_ADDR
    addr.sin_port = htons(static_cast<uint16_t>(env.master_port));
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 128) != 0) {
      error = fmt::format("bootstrap: rank 0 cannot listen on port {}: {}", env.master_port, strerror(errno));
      if (fd >= 0) ::close(fd);
      return false;
    }
    int served = 0;
    while (served < env.world_size - 1) {
      const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
      pollfd pfd{fd, POLLIN, 0};
      const int ready = left > 0 ? ::poll(&pfd, 1, static_cast<int>(left * 1000) + 1) : 0;
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) {
        error = fmt::format("bootstrap: rank 0 on {} saw {} of {} ranks before the {:.0f} s timeout", where,
                            served, env.world_size - 1, timeout_s);
        ::close(fd);
        return false;
      }
      const int peer = ::accept(fd, nullptr, nullptr);
      if (peer < 0) continue;
      // A one-byte "hello" proves the peer is a bench rank before the id goes out.
      char hello = 0;
      if (recv_all(peer, &hello, 1, deadline) && hello == 'F' && send_all(peer, data, bytes)) ++served;
      ::close(peer);
    }
    ::close(fd);
    return true;
  }

  // Other ranks: connect with retries (rank 0 may not be listening yet).
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  std::string last_error = "not attempted";
  while (Clock::now() < deadline) {
    addrinfo* info = nullptr;
    const std::string port = std::to_string(env.master_port);
    const int gai = ::getaddrinfo(env.master_addr.c_str(), port.c_str(), &hints, &info);
    if (gai != 0) {
      error = fmt::format("bootstrap: MASTER_ADDR '{}' does not resolve: {}", env.master_addr, gai_strerror(gai));
      return false;
    }
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    const bool connected = fd >= 0 && ::connect(fd, info->ai_addr, info->ai_addrlen) == 0;
    ::freeaddrinfo(info);
    if (connected) {
      const char hello = 'F';
      const bool ok = send_all(fd, &hello, 1) && recv_all(fd, data, bytes, deadline);
      ::close(fd);
      if (ok) return true;
      last_error = "connection closed before the id arrived";
    } else {
      last_error = strerror(errno);
      if (fd >= 0) ::close(fd);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  error = fmt::format("bootstrap: rank {} could not get the NCCL id from rank 0 at {} within {:.0f} s ({})",
                      env.rank, where, timeout_s, last_error);
  return false;
}

}  // namespace fp8wire
