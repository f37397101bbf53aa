#include "runs/gnuplot.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace spritetorch::runs {

std::optional<std::string> find_gnuplot(const char* path_env) {
  const char* path = path_env ? path_env : std::getenv("PATH");
  if (!path) return std::nullopt;
  std::stringstream dirs(path);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) continue;  // an empty entry means ".": not searched, on purpose
    const std::string candidate = dir + "/gnuplot";
    struct stat info {};
    if (::stat(candidate.c_str(), &info) == 0 && S_ISREG(info.st_mode) && ::access(candidate.c_str(), X_OK) == 0)
      return candidate;
  }
  return std::nullopt;
}

std::string gnuplot_quote(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'')
      out += "''";
    else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
      out += ' ';
    else
      out += c;
  }
  return out + "'";
}

namespace {

std::string last_line(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return last;
}

}  // namespace

GnuplotResult run_gnuplot(const std::string& gnuplot, const std::string& script, const std::string& workdir,
                          const std::string& log_file, double timeout_s) {
  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
  std::vector<char*> argv = {const_cast<char*>(gnuplot.c_str()), const_cast<char*>(script.c_str()), nullptr};
  const pid_t pid = ::fork();
  if (pid < 0) return {false, "could not start gnuplot (fork failed)"};
  if (pid == 0) {
    if (::chdir(workdir.c_str()) != 0) ::_exit(126);
    const int log = ::open(log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (log < 0 || null < 0) ::_exit(126);
    ::dup2(null, 0);
    ::dup2(log, 1);
    ::dup2(log, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  while (true) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0) return {false, "lost track of gnuplot (waitpid failed)"};
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return {false, "gnuplot " + script + " took longer than " + std::to_string(static_cast<int>(timeout_s)) +
                         " s and was stopped"};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return {true, {}};
  std::string why = WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                                      : "signal " + std::to_string(WTERMSIG(status));
  const std::string detail = last_line(workdir + "/" + log_file);
  return {false, "gnuplot " + script + " failed (" + why + ")" + (detail.empty() ? "" : ": " + detail)};
}

}  // namespace spritetorch::runs
