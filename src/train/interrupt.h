// Stopping a run with a checkpoint: SIGINT / SIGTERM in the CLI, request_interrupt() in a program.
//
// The training loop reads a flag after each step (an atomic load: no device sync). When it is set,
// the loop saves a checkpoint and throws Interrupted; the CLI turns that into exit 128 + signal
// (130 for SIGINT, 143 for SIGTERM) and prints the command that resumes the run.
//
// The library installs no signal handler: a program that embeds it keeps its own signal handling.
// An application that wants signals to stop runs sets LoopHooks, called as each training loop
// starts and ends; the CLI's install SIGINT/SIGTERM handlers that call request_interrupt
// (apps/cli/signals.cpp). Only around the loop, not before it: until the loop starts there is
// nothing to save, and a rank waiting in the rendezvous for a peer that died must end at the first
// SIGTERM (launch, torchrun and Slurm send one, then wait), not sit out --dist-timeout.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace spritetorch::train {

// Called as a training loop starts (after clearing any earlier request) and as it ends; with fits
// running at once in several threads, as the first starts and as the last ends.
struct LoopHooks {
  void (*on_start)() = nullptr;
  void (*on_end)() = nullptr;
};
void set_loop_hooks(LoopHooks hooks);

// The Trainer's bracket around its loop: clears the request, then the hooks.
class LoopScope {
 public:
  LoopScope();
  ~LoopScope();
  LoopScope(const LoopScope&) = delete;
  LoopScope& operator=(const LoopScope&) = delete;
};

// The signal requested since the loop started (SIGINT, SIGTERM), or 0.
int interrupt_signal();
// As if `signal` had arrived: the run stops after its current step with a checkpoint. Lock-free,
// so a signal handler may call it; so may another thread or an observer. Returns false when a
// request was already pending (a second Ctrl-C: the CLI then lets the signal kill the process).
// The request is the process's, as a signal is: runs fitted at once in several threads all stop,
// and a run that starts while no other runs clears a request no loop has taken.
bool request_interrupt(int signal);

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
  // The checkpoint could not be written to `wanted` (`why`: the error naming it) and went to the
  // temp folder: checkpoint() is there.
  void saved_elsewhere(std::string wanted, std::string why) {
    wanted_ = std::move(wanted);
    why_ = std::move(why);
  }
  const std::string& wanted() const { return wanted_; }  // empty: checkpoint() is where asked
  const std::string& why() const { return why_; }
  // 128 + signal; 1 when the checkpoint is not where it was asked for (work not delivered, as
  // for a final --save kept in the temp folder).
  int exit_code() const { return wanted_.empty() ? 128 + signal_ : 1; }

 private:
  int signal_;
  std::string checkpoint_, wanted_, why_;
  int64_t epoch_, step_;
  bool main_rank_;
};

// "SIGINT", "SIGTERM", or "signal N".
std::string signal_name(int signal);

}  // namespace spritetorch::train
