// SIGINT / SIGTERM during `train`: finish the current step, checkpoint, stop (train/interrupt.h).
// While a training loop runs, the first signal only requests the stop; a second one from the same
// sender restores the default action and re-raises it, so a stuck run can still be killed with a
// second Ctrl-C. A launcher's forwarded copy of a signal the rank also received directly is not a
// second one (signals.cpp).
#pragma once

namespace spritetorch::cli {

// Sets the library's loop hooks to install these handlers around every training loop.
void stop_runs_on_signals();

}  // namespace spritetorch::cli
