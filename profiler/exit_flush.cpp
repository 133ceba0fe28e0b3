#include "profiler/exit_flush.hpp"

#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <mutex>
#include <thread>

namespace fp8wire::prof {

namespace {

constexpr int kSignals[] = {SIGTERM, SIGINT};
constexpr int slot_of(int sig) { return sig == SIGTERM ? 0 : 1; }

// Plain static storage (no constructor or destructor runs after fork or at exit); only lock-free
// atomics and a semaphore are touched from the signal handler.
std::atomic<ExitFlushCallback> g_flush{nullptr};
std::atomic<pid_t> g_pid{0};  // the process whose worker is running
std::atomic<int> g_timeout_ms{10000};
sem_t g_wake;
std::atomic<uint64_t> g_requested{0};
std::atomic<uint64_t> g_done{0};
std::atomic<bool> g_final_requested{false};
struct sigaction g_previous[2];
thread_local bool t_is_worker = false;

uint64_t request(bool final) {
  if (final) g_final_requested.store(true, std::memory_order_release);
  const uint64_t ticket = g_requested.fetch_add(1, std::memory_order_acq_rel) + 1;
  sem_post(&g_wake);
  return ticket;
}

// Async-signal-safe: atomics, clock_gettime and nanosleep only.
void wait_done(uint64_t ticket) {
  timespec start{};
  clock_gettime(CLOCK_MONOTONIC, &start);
  const int64_t limit_ns = int64_t{g_timeout_ms.load(std::memory_order_relaxed)} * 1'000'000;
  while (g_done.load(std::memory_order_acquire) < ticket) {
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    const int64_t elapsed = (now.tv_sec - start.tv_sec) * 1'000'000'000 + (now.tv_nsec - start.tv_nsec);
    if (elapsed >= limit_ns) return;  // a stuck flush must not keep the process from ending
    timespec nap{0, 1'000'000};
    nanosleep(&nap, nullptr);
  }
}

void worker() {
  sigset_t block;
  sigemptyset(&block);
  for (int sig : kSignals) sigaddset(&block, sig);
  pthread_sigmask(SIG_BLOCK, &block, nullptr);
  t_is_worker = true;
  for (;;) {
    while (sem_wait(&g_wake) != 0 && errno == EINTR) {
    }
    const uint64_t ticket = g_requested.load(std::memory_order_acquire);
    const bool final = g_final_requested.exchange(false, std::memory_order_acq_rel);
    if (ExitFlushCallback flush = g_flush.load(std::memory_order_acquire)) {
      try {
        flush(final);
      } catch (...) {
        // The process is ending or its handler runs next; nothing useful to do with the error.
      }
    }
    uint64_t done = g_done.load(std::memory_order_relaxed);
    while (done < ticket && !g_done.compare_exchange_weak(done, ticket, std::memory_order_release)) {
    }
  }
}

void on_signal(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  const struct sigaction& previous = g_previous[slot_of(sig)];
  const bool by_default = !(previous.sa_flags & SA_SIGINFO) && previous.sa_handler == SIG_DFL;
  // The worker blocks these signals, so this never runs on it.
  if (g_pid.load(std::memory_order_acquire) == getpid()) wait_done(request(/*final=*/by_default));
  if (previous.sa_flags & SA_SIGINFO) {
    if (previous.sa_sigaction) previous.sa_sigaction(sig, info, context);
  } else if (by_default) {
    // The signal is blocked while its handler runs: raised now, it is delivered with the default
    // action as this handler returns, and the process ends by it as it would have without us.
    sigaction(sig, &previous, nullptr);
    raise(sig);
  } else if (previous.sa_handler != SIG_IGN) {
    previous.sa_handler(sig);
  }
  errno = saved_errno;
}

}  // namespace

bool install_exit_flush(ExitFlushCallback flush, int timeout_ms) {
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  const pid_t pid = getpid();
  if (g_pid.load(std::memory_order_acquire) == pid) return true;
  g_flush.store(flush, std::memory_order_release);
  g_timeout_ms.store(timeout_ms, std::memory_order_relaxed);
  g_requested.store(0);
  g_done.store(0);
  g_final_requested.store(false);
  if (sem_init(&g_wake, 0, 0) != 0) return false;
  try {
    std::thread(worker).detach();  // detached: it waits for requests for the life of the process
  } catch (...) {
    return false;
  }
  g_pid.store(pid, std::memory_order_release);
  for (int sig : kSignals) {
    const int slot = slot_of(sig);
    struct sigaction current {};
    if (sigaction(sig, nullptr, &current) != 0) continue;
    const bool ours = (current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_signal;
    // A forked child inherits our handler, and with it the parent's record of what came before:
    // keep that record, or the handler would chain to itself.
    if (ours) continue;
    if (!(current.sa_flags & SA_SIGINFO) && current.sa_handler == SIG_IGN) continue;  // stays ignored
    g_previous[slot] = current;
    struct sigaction action {};
    action.sa_sigaction = on_signal;
    action.sa_flags = SA_SIGINFO | SA_RESTART | (current.sa_flags & SA_ONSTACK);
    sigemptyset(&action.sa_mask);
    for (int other : kSignals) sigaddset(&action.sa_mask, other);
    sigaction(sig, &action, nullptr);
  }
  return true;
}

void flush_before_exit() {
  if (g_pid.load(std::memory_order_acquire) != getpid() || t_is_worker) return;
  wait_done(request(/*final=*/true));
}

}  // namespace fp8wire::prof
