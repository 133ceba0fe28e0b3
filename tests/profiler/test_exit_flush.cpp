// The profiler's last flush on SIGTERM, SIGINT and _exit (profiler/exit_flush.hpp), each scenario
// in a forked child so the signals and handlers are real: the flush runs (final when the process is
// about to end by the signal's default action), the process still ends the way it would have, an
// application's own handler still runs and decides, an ignored signal stays ignored, a stuck flush
// does not keep the process alive, and a forked child that calls _exit does not flush the parent's data.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "profiler/exit_flush.hpp"

using namespace fp8wire::prof;

namespace {

int g_report_fd = -1;  // the child writes what happened here: F = final flush, P = partial, A = app handler

void record(char c) {
  if (g_report_fd >= 0) (void)!::write(g_report_fd, &c, 1);
}
void flush_callback(bool final) { record(final ? 'F' : 'P'); }
void slow_flush(bool) {
  record('S');
  std::this_thread::sleep_for(std::chrono::seconds(30));
}
void app_handler(int) { record('A'); }

struct Outcome {
  std::string record;
  int exit_code = -1;  // when it exited
  int signal = 0;      // when a signal ended it
  double seconds = 0;
};

// Runs `child` in a forked process with a pipe for its records; the child must end on its own.
template <class F>
Outcome run_child(F&& child) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    g_report_fd = fds[1];
    child();
    ::_exit(0);
  }
  ::close(fds[1]);
  Outcome out;
  char buffer[64];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) > 0;) out.record.append(buffer, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (WIFEXITED(status)) out.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) out.signal = WTERMSIG(status);
  return out;
}

}  // namespace

TEST_CASE("exit flush: SIGTERM and SIGINT with the default action flush finally, then end the process by the signal") {
  for (int sig : {SIGTERM, SIGINT}) {
    CAPTURE(sig);
    const Outcome o = run_child([sig] {
      ::signal(sig, SIG_DFL);
      REQUIRE(install_exit_flush(flush_callback));
      ::raise(sig);
      record('X');  // never reached: the signal ends the process
    });
    CHECK(o.record == "F");
    CHECK(o.signal == sig);
  }
}

TEST_CASE("exit flush: an application's handler still runs after a partial flush and decides what happens") {
  const Outcome o = run_child([] {
    ::signal(SIGTERM, app_handler);
    REQUIRE(install_exit_flush(flush_callback));
    ::raise(SIGTERM);
    record('C');  // the application's handler returned: the process carries on
    ::_exit(5);
  });
  CHECK(o.record == "PAC");
  CHECK(o.exit_code == 5);
}

TEST_CASE("exit flush: an ignored signal stays ignored") {
  const Outcome o = run_child([] {
    ::signal(SIGTERM, SIG_IGN);
    REQUIRE(install_exit_flush(flush_callback));
    ::raise(SIGTERM);
    record('C');
  });
  CHECK(o.record == "C");
  CHECK(o.exit_code == 0);
}

TEST_CASE("exit flush: _exit flushes in the installing process only, not in a child it forks") {
  const Outcome o = run_child([] {
    REQUIRE(install_exit_flush(flush_callback));
    const pid_t grandchild = ::fork();
    if (grandchild == 0) {
      flush_before_exit();  // a forked child calling _exit after a failed exec: nothing to flush
      ::_exit(0);
    }
    int status = 0;
    ::waitpid(grandchild, &status, 0);
    record('G');
    flush_before_exit();
    ::_exit(3);
  });
  CHECK(o.record == "GF");
  CHECK(o.exit_code == 3);
}

TEST_CASE("exit flush: installing twice chains once; a child that installs again does not chain to itself") {
  const Outcome o = run_child([] {
    ::signal(SIGTERM, SIG_DFL);
    REQUIRE(install_exit_flush(flush_callback));
    REQUIRE(install_exit_flush(flush_callback));
    const pid_t grandchild = ::fork();
    if (grandchild == 0) {
      REQUIRE(install_exit_flush(flush_callback));
      ::raise(SIGTERM);
      ::_exit(9);
    }
    int status = 0;
    ::waitpid(grandchild, &status, 0);
    record(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM ? 'T' : '?');
  });
  CHECK(o.record == "FT");
  CHECK(o.exit_code == 0);
}

TEST_CASE("exit flush: a stuck flush does not keep a terminated process alive") {
  const Outcome o = run_child([] {
    ::signal(SIGTERM, SIG_DFL);  // not the test runner's crash handler, inherited through fork
    REQUIRE(install_exit_flush(slow_flush, /*timeout_ms=*/300));
    ::raise(SIGTERM);
  });
  CHECK(o.record == "S");
  CHECK(o.signal == SIGTERM);
  CHECK(o.seconds < 10);
}
