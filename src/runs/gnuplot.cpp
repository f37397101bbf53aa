#include "runs/gnuplot.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
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
    if (::stat(candidate.c_str(), &info) == 0 && S_ISREG(info.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0)
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

std::vector<GnuplotResult> run_gnuplots(const std::string& gnuplot,
                                        const std::vector<GnuplotJob>& jobs,
                                        const std::string& workdir, double timeout_s) {
  std::vector<GnuplotResult> results(jobs.size());
  std::vector<pid_t> running(jobs.size(), -1);
  for (size_t i = 0; i < jobs.size(); ++i) {
    // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
    const std::string picture = "picture=" + gnuplot_quote(jobs[i].picture);
    std::vector<char*> argv = {const_cast<char*>(gnuplot.c_str())};
    if (!jobs[i].picture.empty()) {
      argv.push_back(const_cast<char*>("-e"));
      argv.push_back(const_cast<char*>(picture.c_str()));
    }
    argv.push_back(const_cast<char*>(jobs[i].script.c_str()));
    argv.push_back(nullptr);
    const char* log_file = jobs[i].log_file.c_str();
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
      results[i] = {false, "could not start gnuplot (fork failed)"};
      continue;
    }
    if (pid == 0) {
      // Ends with us: a run killed while its pictures draw (SIGTERM, SIGKILL) left gnuplot
      // running for minutes under init. (A parent gone before the prctl: _exit at once.)
      if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) ::_exit(126);
      if (::chdir(workdir.c_str()) != 0) ::_exit(126);
      const int log = ::open(log_file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (log < 0 || null < 0) ::_exit(126);
      ::dup2(null, 0);
      ::dup2(log, 1);
      ::dup2(log, 2);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    running[i] = pid;
  }
  // All of them at once: a picture takes ~0.1-0.4 s of one core, so they draw side by side.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  size_t left = 0;
  for (const pid_t pid : running) left += pid > 0;
  while (left > 0) {
    const bool late = std::chrono::steady_clock::now() > deadline;
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (running[i] <= 0) continue;
      int status = 0;
      const pid_t done = ::waitpid(running[i], &status, WNOHANG);
      if (done == 0 && !late) continue;
      if (done == 0) {  // past the deadline
        ::kill(running[i], SIGKILL);
        ::waitpid(running[i], &status, 0);
        results[i] = {false, "gnuplot " + jobs[i].script + " took longer than " +
                                 std::to_string(static_cast<int>(timeout_s)) +
                                 " s and was stopped"};
      } else if (done < 0) {
        results[i] = {false, "lost track of gnuplot (waitpid failed)"};
      } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        results[i] = {true, {}};
      } else {
        const std::string why = WIFEXITED(status)
                                    ? "exit status " + std::to_string(WEXITSTATUS(status))
                                    : "signal " + std::to_string(WTERMSIG(status));
        const std::string detail = last_line(workdir + "/" + jobs[i].log_file);
        results[i] = {false, "gnuplot " + jobs[i].script + " failed (" + why + ")" +
                                 (detail.empty() ? "" : ": " + detail)};
      }
      running[i] = -1;
      --left;
    }
    if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return results;
}

}  // namespace spritetorch::runs
