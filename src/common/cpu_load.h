// How much of this process's CPUs other processes keep busy: what the trainer's thread governor
// (train/thread_governor.h) acts on. Read from /proc/stat (Linux); elsewhere it is unknown.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace spritetorch {

// CPU time spent so far, in seconds.
struct CpuTimes {
  double busy_s = -1;  // by everything, on the CPUs this process may run on (-1: unknown)
  double own_s = 0;    // by this process, all its threads
  double wall_s = 0;   // steady_seconds() (common/timer.h)
  int cpus = 0;        // CPUs this process may run on (0: unknown)
};
CpuTimes read_cpu_times();

// The busy seconds of the CPUs numbered in `cpus` (empty: every "cpuN" line) in the text of
// /proc/stat: user, nice, system, irq, softirq and steal (a hypervisor's steal takes a virtual CPU
// as surely as a process does); -1 when no such line is found.
double busy_seconds_in_proc_stat(const std::string& text, const std::vector<int>& cpus,
                                 double ticks_per_second);

// The CPUs that other processes kept busy on average between two readings,
// (busy - own) / wall, from 0 to the CPUs read; nullopt when unknown or when less than
// kShortestReading seconds passed.
constexpr double kShortestReading = 0.1;
std::optional<double> other_processes_cpus(const CpuTimes& from, const CpuTimes& to);

// Threads for work that forks and joins over `cores` while other processes keep `others` CPUs
// busy: one core fewer for each of their CPUs from 0.6 on (cores - floor(others + 0.4)), at least
// 1. A fork-join step waits at every join for its slowest thread, and a thread that shares its core
// waits for the scheduler: on 2 cores beside one busy process, 1 thread beat 2 by 2.2x (generator)
// and 2.3x (fused MLP); beside a process busy half the time, 2 threads still beat 1 for the
// generator (docs/benchmarks.md, "Beside other processes").
int threads_beside(int cores, double others);

// Sleeps, in slices of `slice_s`, until this process's other threads have used under a tenth of
// each of two slices in a row (or `most_s` have passed), and returns the seconds it waited. A BLAS
// library's worker threads keep spinning after a parallel call (OpenBLAS 0.3.21: a whole core for
// ~0.13 s after a 2048^3 sgemm on 2 cores), so work timed right after one shares its cores with
// them: one-epoch bench rows ran 1.2-1.4x slower behind bench's own floor measurement
// (docs/benchmarks.md).
double wait_for_own_threads_to_idle(double most_s = 2.0, double slice_s = 0.01);

// How long one cache line takes to pass from one of this process's CPUs to another, in ns: two
// threads hand a counter back and forth for about `most_s` seconds, and half the median round
// trip of batches of 16 is the answer. nullopt where the process may run on one CPU only. The
// fused CPU step's threads exchange about a thousand lines a step by count (activations split by
// units, then by rows; gradients summed across them), an sgemm's hardly any; on the 2-vCPU Zen 5
// VM it took 190-230 ns in the spells where the step's exchanging phases ran up to 2x slower
// and the sgemm barely slower (docs/benchmarks.md): `bench` reports it beside the floor.
std::optional<double> cross_core_transfer_ns(double most_s = 0.005);

}  // namespace spritetorch
