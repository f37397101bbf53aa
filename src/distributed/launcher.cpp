#include "distributed/launcher.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "common/error.h"

namespace spritetorch::distributed {

int free_tcp_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw Error("launch: cannot open a socket to find a free port");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  if (!ok) throw Error("launch: cannot find a free TCP port", "pass --master-port");
  return ntohs(addr.sin_port);
}

namespace {

std::string self_executable() {
  char buffer[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  if (n <= 0) throw Error("launch: cannot find this program's path (/proc/self/exe)");
  return std::string(buffer, static_cast<size_t>(n));
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string describe_status(int status) {
  if (WIFSIGNALED(status))
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  return "exited with code " + std::to_string(exit_code_of(status));
}

// SIGINT / SIGTERM to the launcher: recorded here, forwarded to the ranks by the wait loop.
volatile sig_atomic_t g_received_signal = 0;
volatile sig_atomic_t g_signal_count = 0;
extern "C" void on_launcher_signal(int signal) {
  g_received_signal = signal;
  g_signal_count = g_signal_count + 1;
}

// Installs the forwarding handlers for the launcher's lifetime.
class ForwardSignals {
 public:
  ForwardSignals() {
    g_received_signal = 0;
    g_signal_count = 0;
    struct sigaction action {};
    action.sa_handler = on_launcher_signal;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &old_int_);
    sigaction(SIGTERM, &action, &old_term_);
  }
  ~ForwardSignals() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  ForwardSignals(const ForwardSignals&) = delete;
  ForwardSignals& operator=(const ForwardSignals&) = delete;

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

// The folder where the ranks other than the first leave their error messages (see launcher.h),
// removed with what is in it when the launch ends. Empty when it could not be made: the ranks
// then print their errors themselves.
class ErrorFolder {
 public:
  ErrorFolder() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/spritetorch-launch-XXXXXX";
    if (::mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~ErrorFolder() {
    if (path_.empty()) return;
    for (const auto& file : written_) std::remove(file.c_str());
    ::rmdir(path_.c_str());
  }
  ErrorFolder(const ErrorFolder&) = delete;
  ErrorFolder& operator=(const ErrorFolder&) = delete;

  const std::string& path() const { return path_; }
  // Rank `rank`'s message ("" when it left none), read once it has ended.
  std::string read(int rank) {
    if (path_.empty()) return "";
    const std::string file = path_ + "/rank-" + std::to_string(rank);
    std::ifstream in(file, std::ios::binary);
    if (!in) return "";
    written_.push_back(file);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  }

 private:
  std::string path_;
  std::vector<std::string> written_;
};

// "1", "1, 3", "1-3": a list of ranks for a message.
std::string rank_list(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    text += (text.empty() ? "" : ", ") + std::to_string(ranks[i]);
    if (j > i) text += (j == i + 1 ? ", " : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return text;
}

}  // namespace

std::string launched_error_file() {
  const char* folder = std::getenv(kLaunchErrorsVariable);
  const char* rank = std::getenv("RANK");
  if (folder == nullptr || *folder == '\0' || rank == nullptr || *rank == '\0') return "";
  for (const char* c = rank; *c; ++c)
    if (*c < '0' || *c > '9') return "";
  return std::string(folder) + "/rank-" + rank;
}

std::vector<std::pair<std::vector<int>, std::string>> errors_to_show(
    const std::string& first, const std::vector<std::pair<int, std::string>>& others) {
  std::vector<std::pair<std::vector<int>, std::string>> shown;
  for (const auto& [rank, message] : others) {
    if (message.empty() || message == first) continue;
    bool joined = false;
    for (auto& entry : shown)
      if (entry.second == message) {
        entry.first.push_back(rank);
        joined = true;
        break;
      }
    if (!joined) shown.push_back({{rank}, message});
  }
  return shown;
}

bool reported_before(int status_a, int status_b) {
  return WIFSIGNALED(status_a) && !WIFSIGNALED(status_b);
}

LaunchResult launch_local_ranks(const LaunchOptions& options,
                                const std::function<void(const std::string&)>& log) {
  if (options.nproc_per_node < 1) throw Error("--nproc-per-node must be at least 1");
  // One rank per GPU, or ranks sharing the cores: far past a machine's GPUs or cores, a count is a
  // typo that would start processes until the machine gives out.
  if (options.nproc_per_node > kMaxRanksPerNode)
    throw Error("--nproc-per-node " + std::to_string(options.nproc_per_node) + ": at most " +
                    std::to_string(kMaxRanksPerNode) + " ranks on one machine",
                "one rank per GPU, or on the CPU a few per machine (they share its cores)");
  if (options.nnodes < 1) throw Error("--nnodes must be at least 1");
  if (options.node_rank < 0 || options.node_rank >= options.nnodes)
    throw Error("--node-rank " + std::to_string(options.node_rank) + " is not in [0, " +
                std::to_string(options.nnodes) + ")");
  if (options.args.empty())
    throw Error("launch: no command to run", "spritetorch launch --nproc-per-node 2 -- train ...");
  // Only train runs as ranks of one job; any other command would run N times over, side by side
  // (bench's rows would each form a process group; launch inside launch would start N jobs).
  if (options.args.front() != "train")
    throw Error("launch starts the ranks of a training run: its command is train, not '" +
                    options.args.front() + "'",
                "spritetorch launch --nproc-per-node 2 -- train ...; run `spritetorch " +
                    options.args.front() + "` without launch");
  // An address no rank could reach would leave each waiting out --dist-timeout (300 s by default)
  // while c10d logs every retry: resolved here, once, before any rank starts.
  if (options.master_addr.empty())
    throw Error("--master-addr is empty",
                "name node 0 (a host name or an IP address; 127.0.0.1 on one machine)");
  {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = ::getaddrinfo(options.master_addr.c_str(), nullptr, &hints, &found);
    if (found) ::freeaddrinfo(found);
    if (rc != 0)
      throw Error("--master-addr " + options.master_addr + " cannot be resolved (" +
                      ::gai_strerror(rc) + ")",
                  "name node 0 by a host name this machine resolves, or by its IP address");
  }
  if (options.nnodes > 1 && options.master_port == 0)
    throw Error("launch: --master-port is required with --nnodes > 1",
                "every node must pass the same --master-addr and --master-port");
  const int port = options.master_port ? options.master_port : free_tcp_port();
  const int world = options.nnodes * options.nproc_per_node;
  const std::string exe = self_executable();

  std::vector<std::string> argv_text = {exe};
  argv_text.insert(argv_text.end(), options.args.begin(), options.args.end());
  std::vector<char*> argv;
  for (auto& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);

  const pid_t launcher = ::getpid();
  ErrorFolder errors;
  ForwardSignals forward_signals;
  std::vector<pid_t> pids(static_cast<size_t>(options.nproc_per_node), -1);
  std::vector<bool> running(pids.size(), false);
  auto stop_all = [&](int signal) {
    for (size_t i = 0; i < pids.size(); ++i)
      if (running[i]) ::kill(pids[i], signal);
  };
  int started = 0;
  for (int local = 0; local < options.nproc_per_node; ++local) {
    if (g_signal_count > 0) break;  // stopped while starting: the ranks so far get the signal below
    const int rank = options.node_rank * options.nproc_per_node + local;
    const pid_t pid = ::fork();
    if (pid < 0) {
      stop_all(SIGKILL);
      throw Error("launch: fork failed for rank " + std::to_string(rank));
    }
    if (pid == 0) {
      // The child: die with the launcher; become rank `rank`. Its own process group keeps a
      // terminal's Ctrl-C from reaching it directly: the launcher forwards exactly one signal,
      // since a second one would kill a rank before it has saved its checkpoint.
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != launcher) ::_exit(1);
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(options.nproc_per_node).c_str(), 1);
      ::setenv("GROUP_RANK", std::to_string(options.node_rank).c_str(), 1);
      ::setenv("MASTER_ADDR", options.master_addr.c_str(), 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      if (errors.path().empty())
        ::unsetenv(kLaunchErrorsVariable);
      else
        ::setenv(kLaunchErrorsVariable, errors.path().c_str(), 1);
      // A launch inside a torchrun worker inherits its agent's variables: with them every rank
      // would join a store torchrun's agent hosts on some other port, and wait out --dist-timeout.
      ::unsetenv("TORCHELASTIC_USE_AGENT_STORE");
      ::unsetenv("TORCHELASTIC_RESTART_COUNT");
      ::execv(exe.c_str(), argv.data());
      ::_exit(127);
    }
    pids[static_cast<size_t>(local)] = pid;
    running[static_cast<size_t>(local)] = true;
    ++started;
  }
  log("launch: " + std::to_string(started) + " rank(s) of " + std::to_string(world) +
      " started, rendezvous at " + options.master_addr + ":" + std::to_string(port));

  LaunchResult result;
  bool result_interrupted = false;  // result.exit_code is an orderly interrupt's, not a failure's
  int alive = started;
  std::chrono::steady_clock::time_point kill_at{};
  bool stopping = false;  // a rank failed: the others are being stopped
  int forwarded = 0;      // signals passed on to the ranks (the first checkpoints, a second kills)
  while (alive > 0) {
    if (g_signal_count > forwarded) {
      forwarded = g_signal_count;
      const int signal = forwarded == 1 ? static_cast<int>(g_received_signal) : SIGKILL;
      log(std::string("launch: ") + strsignal(g_received_signal) +
          (forwarded == 1 ? "; passing it on to the ranks (they checkpoint and stop; a second "
                            "signal kills them)"
                          : " again; killing the ranks"));
      stop_all(signal);
    }
    // Polled rather than blocking, so a signal that lands just before the wait is not missed.
    // Every rank that has ended is reaped before any is blamed: a killed rank's peer fails within
    // milliseconds, and waitpid(-1) hands back the older child (rank 0) first, so blaming the first
    // one reaped would name the peer instead of the rank that died.
    std::vector<std::pair<size_t, int>> ended;  // (local index, wait status)
    for (;;) {
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid < 0 && errno == EINTR) continue;
      if (pid <= 0) {
        if (pid < 0 && ended.empty()) alive = 0;  // no children left
        break;
      }
      for (size_t i = 0; i < pids.size(); ++i)
        if (pids[i] == pid && running[i]) ended.emplace_back(i, status);
    }
    if (alive == 0) break;
    if (ended.empty()) {  // nobody exited yet
      if (stopping && std::chrono::steady_clock::now() >= kill_at) stop_all(SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    std::stable_sort(ended.begin(), ended.end(), [](const auto& a, const auto& b) {
      return reported_before(a.second, b.second);
    });
    for (const auto& [i, status] : ended) {
      running[i] = false;
      --alive;
      const int rank = options.node_rank * options.nproc_per_node + static_cast<int>(i);
      const int code = exit_code_of(status);
      // Exit 130/143 (not a death by the signal) is a rank that stopped on SIGINT/SIGTERM after the
      // step the ranks agreed on (train/parallel.h): the others stop at that step too, and rank 0
      // may still be writing the checkpoint, so they are left to finish; a SIGTERM now would be a
      // second signal to them and kill them mid-save. A failure still outranks it.
      const bool interrupted = WIFEXITED(status) && (code == 128 + SIGINT || code == 128 + SIGTERM);
      if (code != 0 && (result.exit_code == 0 || (result_interrupted && !interrupted))) {
        result.exit_code = code;
        result.failed_rank = rank;
        result_interrupted = interrupted;
      }
      // A rank stopping because of a forwarded signal is expected; the others stop on their own
      // at the same step (train/parallel.h), so they are not hurried.
      if (code != 0 && !interrupted && !stopping && forwarded == 0) {
        log("launch: rank " + std::to_string(rank) + " " + describe_status(status) +
            "; stopping the other ranks");
        stopping = true;
        stop_all(SIGTERM);
        kill_at = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(static_cast<int64_t>(options.grace_s * 1000));
      }
    }
  }
  // The errors of the ranks after the first that it did not print itself.
  const int first_rank = options.node_rank * options.nproc_per_node;
  const std::string first = errors.read(first_rank);
  std::vector<std::pair<int, std::string>> others;
  for (int local = 1; local < started; ++local)
    others.emplace_back(first_rank + local, errors.read(first_rank + local));
  for (const auto& [ranks, message] : errors_to_show(first, others)) {
    log("launch: rank" + std::string(ranks.size() > 1 ? "s " : " ") + rank_list(ranks) +
        " reported:");
    std::istringstream lines(message);
    for (std::string line; std::getline(lines, line);) log(line);
  }
  // Stopped by a signal before every rank was started: the job did not run, whatever the ranks
  // that did start made of the signal.
  if (started < options.nproc_per_node && result.exit_code == 0)
    result.exit_code = 128 + static_cast<int>(g_received_signal);
  return result;
}

}  // namespace spritetorch::distributed
