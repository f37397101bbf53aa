#include "train/interrupt.h"

#include <signal.h>

#include <atomic>

namespace spritetorch::train {

namespace {

// Lock-free, hence safe to touch from a signal handler.
std::atomic<int> g_signal{0};
struct sigaction g_old_int, g_old_term;

extern "C" void on_signal(int signal) {
  int expected = 0;
  if (!g_signal.compare_exchange_strong(expected, signal)) {
    // Second signal: the user means it. Default action, re-raised.
    ::signal(signal, SIG_DFL);
    ::raise(signal);
  }
}

}  // namespace

InterruptGuard::InterruptGuard() {
  g_signal.store(0);
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // file writes and waits in LibTorch/OpenBLAS carry on undisturbed
  sigaction(SIGINT, &action, &g_old_int);
  sigaction(SIGTERM, &action, &g_old_term);
}

InterruptGuard::~InterruptGuard() {
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
}

int interrupt_signal() { return g_signal.load(std::memory_order_relaxed); }

void request_interrupt(int signal) {
  int expected = 0;
  g_signal.compare_exchange_strong(expected, signal);
}

Interrupted::Interrupted(int signal, std::string checkpoint, int64_t epoch, int64_t step,
                         bool main_rank)
    : std::runtime_error("interrupted by " + signal_name(signal) + " at epoch " +
                         std::to_string(epoch) + ", step " + std::to_string(step)),
      signal_(signal),
      checkpoint_(std::move(checkpoint)),
      epoch_(epoch),
      step_(step),
      main_rank_(main_rank) {}

std::string signal_name(int signal) {
  if (signal == SIGINT) return "SIGINT";
  if (signal == SIGTERM) return "SIGTERM";
  return "signal " + std::to_string(signal);
}

}  // namespace spritetorch::train
