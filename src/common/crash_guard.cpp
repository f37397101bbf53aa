#include "common/crash_guard.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "common/error.h"

namespace spritetorch {

void try_in_child_process(const std::function<void()>& work, const std::string& file,
                          const std::string& expected, double give_up_s) {
  const pid_t pid = fork();
  if (pid < 0) return;
  if (pid == 0) {
    int code = 0;
    try {
      work();
    } catch (...) {
      code = 3;  // an error the parent reports when it does the work itself
    }
    _exit(code);  // no atexit handlers, no flushing of the parent's buffers twice
  }
  int status = 0;
  const auto give_up = std::chrono::steady_clock::now() +
                       std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(give_up_s));
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0) return;
    if (std::chrono::steady_clock::now() > give_up) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (WIFSIGNALED(status))
    throw DataError(file, expected,
                    "a file whose reading crashed the reader (signal " +
                        std::to_string(WTERMSIG(status)) + ", in a child process)");
}

}  // namespace spritetorch
