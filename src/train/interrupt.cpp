#include "train/interrupt.h"

#include <signal.h>

#include <atomic>
#include <mutex>

namespace spritetorch::train {

namespace {

// Lock-free, hence safe to touch from a signal handler.
std::atomic<int> g_signal{0};
LoopHooks g_hooks;

}  // namespace

void set_loop_hooks(LoopHooks hooks) { g_hooks = hooks; }

// Loops running now in this process (fits in several threads): the first to start clears the
// request and calls on_start, the last to end calls on_end, so that one fit ending neither removes
// the handlers another still runs under nor clears a request that other has not yet taken.
std::mutex g_loops_mutex;
int g_loops = 0;

LoopScope::LoopScope() {
  const std::lock_guard<std::mutex> lock(g_loops_mutex);
  if (g_loops++ > 0) return;
  g_signal.store(0);
  if (g_hooks.on_start) g_hooks.on_start();
}

LoopScope::~LoopScope() {
  const std::lock_guard<std::mutex> lock(g_loops_mutex);
  if (--g_loops > 0) return;
  if (g_hooks.on_end) g_hooks.on_end();
}

int interrupt_signal() { return g_signal.load(std::memory_order_relaxed); }

bool request_interrupt(int signal) {
  int expected = 0;
  return g_signal.compare_exchange_strong(expected, signal);
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
