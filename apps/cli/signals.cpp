#include "signals.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>

#include "train/interrupt.h"

namespace spritetorch::cli {

namespace {

struct sigaction g_old_int, g_old_term;
bool g_installed = false;  // g_old_* hold the actions from before the first install

// Signals are counted per sender: the parent process (spritetorch launch or torchrun, passing on
// the signal it received) and everyone else (the terminal, kill, Slurm). A preemption or a
// `pkill`/`kill launch rank0 rank1` signals the launcher and every rank at once, and the launcher
// passes its copy on: each rank receives the one stop request twice, in either order, within
// milliseconds or seconds on a loaded machine. A time window would either kill such a rank or
// swallow a real second Ctrl-C; by sender, the forwarded copy is never taken for "the user means
// it", while a second signal from the same sender (a second Ctrl-C or kill) still kills.
pid_t g_parent = 0;
std::atomic<bool> g_from_parent{false}, g_from_others{false};  // lock-free: signal-safe

extern "C" void on_signal(int signal, siginfo_t* info, void*) {
  // si_code <= 0: sent by a process (kill, sigqueue, tgkill), so si_pid names it.
  const bool from_parent = info && info->si_code <= 0 && g_parent > 1 && info->si_pid == g_parent;
  if ((from_parent ? g_from_parent : g_from_others).exchange(true)) {  // this sender's second
    ::signal(signal, SIG_DFL);
    ::raise(signal);
    return;
  }
  train::request_interrupt(signal);  // false when the other sender asked first: still one stop
}

void install() {
  g_parent = ::getppid();
  g_from_parent = false;
  g_from_others = false;
  struct sigaction action {};
  action.sa_sigaction = on_signal;
  sigemptyset(&action.sa_mask);
  // SA_RESTART: file writes and waits in LibTorch/OpenBLAS carry on undisturbed.
  action.sa_flags = SA_RESTART | SA_SIGINFO;
  // A signal the process was started ignoring stays ignored, as shells and most tools keep it: a
  // script's background job (`spritetorch train ... &`) is started with SIGINT ignored, so that
  // the Ctrl-C meant for the script's foreground does not reach it.
  const auto take = [&action](int signal, struct sigaction& before) {
    if (!g_installed) sigaction(signal, nullptr, &before);
    if ((before.sa_flags & SA_SIGINFO) == 0 && before.sa_handler == SIG_IGN) return;
    sigaction(signal, &action, nullptr);
  };
  take(SIGINT, g_old_int);
  take(SIGTERM, g_old_term);
  g_installed = true;
}

void restore() {
  // A run stopping on a signal keeps these handlers until the process exits: the other sender's
  // copy may land after the loop, while the checkpoint's resume command is being printed, and must
  // not kill the process then.
  if (train::interrupt_signal() != 0) return;
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
  g_installed = false;
}

}  // namespace

void stop_runs_on_signals() { train::set_loop_hooks({install, restore}); }

}  // namespace spritetorch::cli
