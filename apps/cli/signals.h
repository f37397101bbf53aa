// SIGINT / SIGTERM during `train`: finish the current step, checkpoint, stop (train/interrupt.h).
// While a training loop runs, the first signal only requests the stop; a second one restores the
// default action and re-raises it, so a stuck run can still be killed with a second Ctrl-C.
#pragma once

namespace spritetorch::cli {

// Sets the library's loop hooks to install these handlers around every training loop.
void stop_runs_on_signals();

}  // namespace spritetorch::cli
