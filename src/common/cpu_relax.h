// One turn of a spin-wait: tells the core that this thread waits (x86's pause), so that it yields
// its share of the core's resources and leaves the loop without a memory-order penalty.
#pragma once

namespace spritetorch {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace spritetorch
