#include "signals.h"

#include <signal.h>

#include "train/interrupt.h"

namespace spritetorch::cli {

namespace {

struct sigaction g_old_int, g_old_term;

extern "C" void on_signal(int signal) {
  if (!train::request_interrupt(signal)) {  // the second one: the user means it
    ::signal(signal, SIG_DFL);
    ::raise(signal);
  }
}

void install() {
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // file writes and waits in LibTorch/OpenBLAS carry on undisturbed
  sigaction(SIGINT, &action, &g_old_int);
  sigaction(SIGTERM, &action, &g_old_term);
}

void restore() {
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
}

}  // namespace

void stop_runs_on_signals() { train::set_loop_hooks({install, restore}); }

}  // namespace spritetorch::cli
