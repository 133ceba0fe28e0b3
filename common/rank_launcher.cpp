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
#include <sys/random.h>
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
#include <set>
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
  if (const char* local_world_s = std::getenv("LOCAL_WORLD_SIZE")) {
    const auto local_world = parse_long(local_world_s);
    if (!local_world || *local_world < 1 || *local_world > env.world_size) {
      error = fmt::format("LOCAL_WORLD_SIZE='{}': expected an integer in [1, WORLD_SIZE={}]", local_world_s,
                          env.world_size);
      return std::nullopt;
    }
    env.local_world_size = static_cast<int>(*local_world);
  }
  if (const char* secret = std::getenv(kBootstrapSecretVariable)) {
    const std::string_view text(secret);
    const bool hex = text.find_first_not_of("0123456789abcdefABCDEF") == std::string_view::npos;
    if (text.size() != kBootstrapSecretDigits || !hex) {
      error = fmt::format("{}: expected {} hex digits (e.g. from `openssl rand -hex 32`), got {} character(s){}",
                          kBootstrapSecretVariable, kBootstrapSecretDigits, text.size(),
                          hex ? "" : " with some that are not hex digits");
      return std::nullopt;
    }
    env.secret = secret;
  }
  return env;
}

std::string make_bootstrap_secret() {
  unsigned char bytes[kBootstrapSecretDigits / 2];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return {};
    got += static_cast<size_t>(n);
  }
  std::string hex;
  for (const unsigned char b : bytes) hex += fmt::format("{:02x}", b);
  return hex;
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
  // Drawn afresh for every launch: only these ranks may take the NCCL id rank 0 serves.
  const std::string secret = make_bootstrap_secret();
  if (secret.empty()) {
    result.error = fmt::format("launch: no random bytes for the bootstrap secret (getrandom: {})", strerror(errno));
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
        {"MASTER_ADDR", "127.0.0.1"},         {"MASTER_PORT", std::to_string(port)},
        {kBootstrapSecretVariable, secret}};
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

namespace {

// A rank's request: this magic, its rank (4 bytes, little-endian) and the first half of the secret.
// Rank 0 answers with the second half, then the data, so each side learns the other holds the
// secret and neither half alone lets a third party pass for the other side.
constexpr char kHelloMagic[8] = {'F', 'P', '8', 'W', 'B', 'O', 'O', 'T'};
constexpr size_t kSecretHalf = kBootstrapSecretDigits / 2;
constexpr size_t kHelloBytes = sizeof(kHelloMagic) + 4 + kSecretHalf;
// Connections waiting for their request at one time; past it the oldest is dropped, so a flood of
// idle connections cannot use up rank 0's descriptors.
constexpr size_t kMaxPendingConnections = 64;

// Without a secret (another launcher that set none) both sides use a fixed text, and rank 0 warns.
std::string secret_half(const RankEnv& env, size_t which) {
  const std::string secret = env.secret.empty() ? std::string(kBootstrapSecretDigits, '0') : env.secret;
  return secret.substr(which * kSecretHalf, kSecretHalf);
}

// Every byte is compared whatever the first difference, so the time taken tells nothing of the secret.
bool same_bytes(const char* a, const char* b, size_t n) {
  unsigned char diff = 0;
  for (size_t i = 0; i < n; ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string hello_of(const RankEnv& env) {
  std::string hello(kHelloMagic, sizeof(kHelloMagic));
  for (int i = 0; i < 4; ++i) hello.push_back(static_cast<char>((static_cast<uint32_t>(env.rank) >> (8 * i)) & 0xFF));
  return hello + secret_half(env, 0);
}

double seconds_until(Clock::time_point t) { return std::chrono::duration<double>(t - Clock::now()).count(); }

int poll_ms(double seconds) { return seconds <= 0 ? 0 : static_cast<int>(std::min(seconds, 3600.0) * 1000) + 1; }

bool is_loopback(const sockaddr_in& addr) { return (ntohl(addr.sin_addr.s_addr) >> 24) == 127; }

// Rank 0's listening socket on MASTER_ADDR (the first of its addresses that can be bound), or -1
// with `error` set.
int listen_on_master_addr(const RankEnv& env, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* info = nullptr;
  const std::string port = std::to_string(env.master_port);
  if (const int gai = ::getaddrinfo(env.master_addr.c_str(), port.c_str(), &hints, &info); gai != 0) {
    error = fmt::format("bootstrap: MASTER_ADDR '{}' does not resolve: {}", env.master_addr, gai_strerror(gai));
    return -1;
  }
  int fd = -1;
  std::string last_error = "no IPv4 address";
  for (addrinfo* a = info; a && fd < 0; a = a->ai_next) {
    sockaddr_in addr{};
    std::memcpy(&addr, a->ai_addr, sizeof(addr));
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &addr.sin_addr, text, sizeof(text));
    // Ranks on other hosts cannot reach a loopback address that a host name resolves to here (as
    // Debian's /etc/hosts maps the host's own name to 127.0.1.1): say so now rather than let them
    // time out. A literal loopback address is a choice (ranks standing in for hosts on one machine).
    in_addr literal{};
    const bool is_name = ::inet_pton(AF_INET, env.master_addr.c_str(), &literal) != 1;
    if (is_name && is_loopback(addr) && env.local_world_size > 0 && env.local_world_size < env.world_size) {
      last_error = fmt::format("it resolves to {} on this host, a loopback address, which the ranks on other "
                               "hosts (WORLD_SIZE {}, LOCAL_WORLD_SIZE {}) cannot reach; set MASTER_ADDR to an "
                               "address of this host that they can",
                               text, env.world_size, env.local_world_size);
      continue;
    }
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    if (fd >= 0) ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 128) != 0) {
      last_error = fmt::format("{}:{}: {}", text, env.master_port, strerror(errno));
      if (fd >= 0) ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(info);
  if (fd < 0)
    error = fmt::format("bootstrap: rank 0 cannot listen on MASTER_ADDR '{}' port {}: {}", env.master_addr,
                        env.master_port, last_error);
  return fd;
}

struct PendingConnection {
  int fd = -1;
  Clock::time_point deadline;
  char hello[kHelloBytes] = {};
  size_t received = 0;
};

// The rank a complete request names, or -1 when it is not this job's (magic, rank range, secret).
int requesting_rank(const RankEnv& env, const PendingConnection& c) {
  const bool magic = same_bytes(c.hello, kHelloMagic, sizeof(kHelloMagic));
  const bool secret = same_bytes(c.hello + sizeof(kHelloMagic) + 4, secret_half(env, 0).data(), kSecretHalf);
  uint32_t rank = 0;
  for (int i = 0; i < 4; ++i) rank |= static_cast<uint32_t>(static_cast<unsigned char>(c.hello[sizeof(kHelloMagic) + i])) << (8 * i);
  if (!magic || !secret || rank < 1 || rank >= static_cast<uint32_t>(env.world_size)) return -1;
  return static_cast<int>(rank);
}

// Sends the answer on a connection that presented the secret: blocking, with a deadline of its own.
bool answer(const RankEnv& env, int fd, const void* data, size_t bytes) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) return false;
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(kBootstrapHelloSeconds);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  const std::string half = secret_half(env, 1);
  return send_all(fd, half.data(), half.size()) && send_all(fd, data, bytes);
}

bool serve_blob(const RankEnv& env, const void* data, size_t bytes, Clock::time_point deadline, double timeout_s,
                std::string& error) {
  const int listener = listen_on_master_addr(env, error);
  if (listener < 0) return false;
  if (env.secret.empty())
    std::fprintf(stderr,
                 "fp8wire bootstrap: warning: %s is not set, so any program that reaches %s:%d can take a rank's "
                 "place; set it to the same %zu hex digits on every rank (e.g. `openssl rand -hex 32`)\n",
                 kBootstrapSecretVariable, env.master_addr.c_str(), env.master_port, kBootstrapSecretDigits);
  std::set<int> served;
  std::vector<PendingConnection> pending;
  auto drop = [](PendingConnection& c) {
    ::close(c.fd);
    c.fd = -1;
  };
  bool ok = true;
  while (static_cast<int>(served.size()) < env.world_size - 1) {
    const auto now = Clock::now();
    if (now >= deadline) {
      std::string missing;
      for (int r = 1; r < env.world_size; ++r)
        if (!served.count(r)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      error = fmt::format("bootstrap: rank 0 on {}:{} saw {} of {} ranks before the {:.0f} s timeout (missing: {})",
                          env.master_addr, env.master_port, served.size(), env.world_size - 1, timeout_s, missing);
      ok = false;
      break;
    }
    // A connection that has not sent its whole request by its deadline is dropped.
    Clock::time_point wake = deadline;
    for (PendingConnection& c : pending) {
      if (c.deadline <= now) drop(c);
      else wake = std::min(wake, c.deadline);
    }
    std::erase_if(pending, [](const PendingConnection& c) { return c.fd < 0; });
    std::vector<pollfd> fds{{listener, POLLIN, 0}};
    for (const PendingConnection& c : pending) fds.push_back({c.fd, POLLIN, 0});
    const int ready = ::poll(fds.data(), fds.size(), poll_ms(seconds_until(wake)));
    if (ready < 0 && errno != EINTR) {
      error = fmt::format("bootstrap: rank 0 on {}:{}: poll: {}", env.master_addr, env.master_port, strerror(errno));
      ok = false;
      break;
    }
    if (ready <= 0) continue;
    for (size_t i = 0; i < pending.size(); ++i) {
      PendingConnection& c = pending[i];
      if (!fds[i + 1].revents) continue;
      const ssize_t n = ::recv(c.fd, c.hello + c.received, kHelloBytes - c.received, 0);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      if (n <= 0) {
        drop(c);  // closed before its request was whole
        continue;
      }
      c.received += static_cast<size_t>(n);
      if (c.received < kHelloBytes) continue;
      // A rank asking twice (its first answer was lost) is served again and counted once.
      const int rank = requesting_rank(env, c);
      if (rank > 0 && answer(env, c.fd, data, bytes)) served.insert(rank);
      drop(c);
    }
    std::erase_if(pending, [](const PendingConnection& c) { return c.fd < 0; });
    if (fds[0].revents) {
      for (;;) {
        const int peer = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (peer < 0) break;  // EAGAIN: none left (or a connection already gone)
        if (pending.size() >= kMaxPendingConnections) {
          drop(pending.front());
          pending.erase(pending.begin());
        }
        PendingConnection c;
        c.fd = peer;
        c.deadline = std::min(deadline, Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                           std::chrono::duration<double>(kBootstrapHelloSeconds)));
        pending.push_back(c);
      }
    }
  }
  for (PendingConnection& c : pending) drop(c);
  ::close(listener);
  return ok;
}

}  // namespace

bool exchange_bootstrap_blob(const RankEnv& env, void* data, size_t bytes, double timeout_s, std::string& error) {
  if (env.world_size <= 1) return true;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  if (env.rank == 0) return serve_blob(env, data, bytes, deadline, timeout_s, error);

  // Other ranks: connect with retries (rank 0 may not be listening yet).
  const std::string where = fmt::format("{}:{}", env.master_addr, env.master_port);
  const std::string hello = hello_of(env);
  const std::string expected_answer = secret_half(env, 1);
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
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool connected = fd >= 0 && ::connect(fd, info->ai_addr, info->ai_addrlen) == 0;
    ::freeaddrinfo(info);
    if (connected) {
      char answer_half[kSecretHalf];
      const bool answered = send_all(fd, hello.data(), hello.size()) && recv_all(fd, answer_half, kSecretHalf, deadline);
      if (answered && !same_bytes(answer_half, expected_answer.data(), kSecretHalf)) {
        ::close(fd);
        error = fmt::format("bootstrap: rank {}: the program listening at {} answered without this job's secret "
                            "(another program holds MASTER_PORT?)",
                            env.rank, where);
        return false;
      }
      const bool ok = answered && recv_all(fd, data, bytes, deadline);
      ::close(fd);
      if (ok) return true;
      last_error = fmt::format("rank 0 closed the connection before the id arrived (it drops a request without "
                               "this job's secret: is {} the same on every rank?)",
                               kBootstrapSecretVariable);
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
