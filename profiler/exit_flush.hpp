// The profiler's last flush when a process ends without running atexit handlers: SIGTERM (what
// torchrun sends the surviving ranks when one fails), SIGINT, and _exit (Python's os._exit). Without
// it the steps still waiting for their settle time, and in a short job every step, would be lost.
//
// A signal handler may not take locks or allocate, so it only wakes a worker thread (sem_post is
// async-signal-safe) and waits for it, bounded; the worker runs the flush. Then it chains: to the
// handler the application had installed (that handler decides whether the process ends, so the flush
// only reports the steps closed so far), or, where the action was the default, restores it and
// re-raises, so the process still ends by the signal (the flush is then the final one). A signal the
// application ignores stays ignored. The worker blocks both signals, so a handler never waits on the
// thread it interrupted.
#pragma once

namespace fp8wire::prof {

// final: the process is about to end (report every step, write the summary, close the files);
// otherwise report the steps closed so far and keep going.
using ExitFlushCallback = void (*)(bool final);

// Installs the SIGTERM/SIGINT handlers and starts the worker, once per process (again in a forked
// child, which has the parent's memory but not its threads). Install after the runtime's own
// handlers (Python installs its SIGINT handler only where it finds the default), i.e. lazily.
// False when the worker thread could not start (then nothing is installed).
bool install_exit_flush(ExitFlushCallback flush, int timeout_ms = 10000);

// For an _exit interposer: the final flush, on the worker, waited for (bounded). Does nothing in a
// process that did not install (a forked or vforked child calling _exit after a failed exec), or
// when called from the worker itself.
void flush_before_exit();

}  // namespace fp8wire::prof
