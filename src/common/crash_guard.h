// Reading a file with a third-party reader that can crash on damaged input (LibTorch's TorchScript
// reader: docs/reliability.md): the read is tried first in a child process, so that a crash there
// becomes a clear error here instead of taking the command down.
#pragma once

#include <functional>
#include <string>

namespace spritetorch {

// Runs `work` in a forked child and waits for it. Throws DataError(file, expected, "... crashed
// (signal N)") when the child dies of a signal; returns otherwise, whatever `work` threw (the
// caller then does the work itself and reports its errors). Where fork fails, or the child has not
// ended after `give_up_s` seconds (a lock held across the fork), it returns without a verdict.
void try_in_child_process(const std::function<void()>& work, const std::string& file,
                          const std::string& expected, double give_up_s = 60);

}  // namespace spritetorch
