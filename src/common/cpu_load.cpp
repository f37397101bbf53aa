#include "common/cpu_load.h"

#include "common/cpu_relax.h"
#include "common/timer.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <sstream>
#include <thread>

namespace spritetorch {

namespace {

// The CPUs of this process's affinity mask (empty when it cannot be read: all of them).
std::vector<int> allowed_cpus() {
  std::vector<int> out;
#ifdef __linux__
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return out;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &set)) out.push_back(cpu);
#endif
  return out;
}

// CPU seconds used by all of this process's threads so far; -1 where the clock cannot be read.
double own_cpu_seconds() {
  timespec own{};
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &own) != 0) return -1;
  return static_cast<double>(own.tv_sec) + 1e-9 * static_cast<double>(own.tv_nsec);
}

}  // namespace

double busy_seconds_in_proc_stat(const std::string& text, const std::vector<int>& cpus,
                                 double ticks_per_second) {
  std::istringstream lines(text);
  std::string line;
  double ticks = 0;
  bool found = false;
  while (std::getline(lines, line)) {
    // "cpu3 user nice system idle iowait irq softirq steal guest guest_nice" (guest time is in
    // user already); the "cpu " line is the sum of all, not one of them.
    if (line.size() < 4 || line.compare(0, 3, "cpu") != 0 || line[3] < '0' || line[3] > '9')
      continue;
    std::istringstream fields(line.substr(3));
    int cpu = -1;
    fields >> cpu;
    if (!cpus.empty() && std::find(cpus.begin(), cpus.end(), cpu) == cpus.end()) continue;
    double value[8] = {};
    int read = 0;
    while (read < 8 && fields >> value[read]) ++read;
    if (read < 4) continue;  // user nice system idle at the least
    ticks += value[0] + value[1] + value[2] + value[5] + value[6] + value[7];
    found = true;
  }
  return found ? ticks / ticks_per_second : -1;
}

double wait_for_own_threads_to_idle(double most_s, double slice_s) {
  const double start = steady_seconds();
  int quiet_slices = 0;
  double before = own_cpu_seconds();
  if (before < 0) return 0;  // no process clock: nothing to wait on
  while (quiet_slices < 2 && steady_seconds() - start < most_s) {
    std::this_thread::sleep_for(std::chrono::duration<double>(slice_s));
    const double now = own_cpu_seconds();
    quiet_slices = now - before < 0.1 * slice_s ? quiet_slices + 1 : 0;
    before = now;
  }
  return steady_seconds() - start;
}

CpuTimes read_cpu_times() {
  static const std::vector<int> cpus = allowed_cpus();
  static const double ticks_per_second = static_cast<double>(sysconf(_SC_CLK_TCK));
  CpuTimes out;
  out.wall_s = steady_seconds();
  out.cpus = static_cast<int>(cpus.size());
  out.own_s = std::max(0.0, own_cpu_seconds());
  std::ifstream file("/proc/stat");  // Linux; elsewhere busy_s stays unknown
  if (!file || ticks_per_second <= 0) return out;
  std::stringstream text;
  text << file.rdbuf();
  out.busy_s = busy_seconds_in_proc_stat(text.str(), cpus, ticks_per_second);
  return out;
}

std::optional<double> other_processes_cpus(const CpuTimes& from, const CpuTimes& to) {
  const double wall = to.wall_s - from.wall_s;
  // /proc/stat counts 10 ms ticks: over less than 0.1 s a tick or two is most of the reading
  // (a 1 ms bench row read 6.9 CPUs busy on 2).
  if (from.busy_s < 0 || to.busy_s < 0 || wall < kShortestReading) return std::nullopt;
  const double others = std::max(0.0, (to.busy_s - from.busy_s) - (to.own_s - from.own_s)) / wall;
  const int cpus = std::max(from.cpus, to.cpus);
  return cpus > 0 ? std::min(others, static_cast<double>(cpus)) : others;
}

std::optional<double> cross_core_transfer_ns(double most_s) {
  const auto cpus = allowed_cpus();
  const auto online = std::thread::hardware_concurrency();
  if ((cpus.empty() ? online : cpus.size()) < 2) return std::nullopt;
  // The counter alone on its line: odd values are the caller's serves, even ones the returns.
  struct alignas(64) Line {
    std::atomic<uint32_t> value{0};
  };
  Line ball;
  std::atomic<bool> stop{false};
  std::thread partner([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      // An odd value stays until this thread returns it: the caller waits for the even one.
      const uint32_t v = ball.value.load(std::memory_order_acquire);
      if ((v & 1u) != 0)
        ball.value.store(v + 1, std::memory_order_release);
      else
        cpu_relax();
    }
  });
  constexpr int kBatch = 16;  // ~5 us at 150 ns: the clock's ~20 ns a read is lost in it
  std::vector<double> one_way_ns;
  const double start = steady_seconds();
  uint32_t served = 1;
  bool gave_up = false;
  while (!gave_up && (one_way_ns.size() < 3 || steady_seconds() - start < most_s)) {
    const double t0 = steady_seconds();
    for (int i = 0; i < kBatch && !gave_up; ++i, served += 2) {
      ball.value.store(served, std::memory_order_release);
      // The partner may not get a CPU at all (every other one busy): give up after a second.
      for (unsigned turn = 1; ball.value.load(std::memory_order_acquire) != served + 1; ++turn) {
        cpu_relax();
        if (turn % 4096 == 0 && steady_seconds() - start > 1.0) {
          gave_up = true;
          break;
        }
      }
    }
    if (!gave_up) one_way_ns.push_back((steady_seconds() - t0) * 1e9 / (2.0 * kBatch));
  }
  stop = true;
  partner.join();
  if (one_way_ns.empty()) return std::nullopt;
  std::nth_element(one_way_ns.begin(), one_way_ns.begin() + one_way_ns.size() / 2,
                   one_way_ns.end());
  return one_way_ns[one_way_ns.size() / 2];
}

int threads_beside(int cores, double others) {
  const int taken = static_cast<int>(std::floor(std::max(0.0, others) + 0.4));
  return std::clamp(cores - taken, 1, std::max(1, cores));
}

}  // namespace spritetorch
