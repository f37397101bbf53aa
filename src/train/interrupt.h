// SIGINT / SIGTERM during training: finish the current step, checkpoint, stop.
//
// While an InterruptGuard lives, the first SIGINT or SIGTERM only sets a flag that the training
// loop reads after each step (an atomic load: no device sync). A second signal restores the default
// action and re-raises it, so a stuck run can still be killed with a second Ctrl-C.
// The loop then saves a checkpoint and throws Interrupted; the CLI turns it into exit 128 + signal
// (130 for SIGINT, 143 for SIGTERM) and prints the command that resumes the run.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace spritetorch::train {

class InterruptGuard {
 public:
  InterruptGuard();   // installs the handlers and clears any earlier request
  ~InterruptGuard();  // restores the previous handlers
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;
};

// The signal received since the guard was installed (SIGINT, SIGTERM), or 0.
int interrupt_signal();
// As if `signal` had arrived; for callers that stop a run from another thread, and for tests.
void request_interrupt(int signal);

// Thrown by train() after the checkpoint of an interrupted run is on disk.
class Interrupted : public std::runtime_error {
 public:
  // main_rank: this process wrote the checkpoint (false on ddp ranks other than 0, which stop at
  // the same step and leave the reporting to rank 0).
  Interrupted(int signal, std::string checkpoint, int64_t epoch, int64_t step,
              bool main_rank = true);
  int signal() const { return signal_; }
  const std::string& checkpoint() const { return checkpoint_; }  // written atomically
  bool main_rank() const { return main_rank_; }
  int64_t epoch() const { return epoch_; }  // 1-based epoch in progress
  int64_t step() const { return step_; }    // steps done within it
  int exit_code() const { return 128 + signal_; }

 private:
  int signal_;
  std::string checkpoint_;
  int64_t epoch_, step_;
  bool main_rank_;
};

// "SIGINT", "SIGTERM", or "signal N".
std::string signal_name(int signal);

}  // namespace spritetorch::train
