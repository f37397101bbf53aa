// Subnormal floats flushed to zero on this thread while an object of FlushSubnormals lives (the
// MXCSR's flush-to-zero and denormals-are-zero bits, what torch.set_flush_denormal(True) sets),
// the thread's mode restored after it.
//
// Why the optimizer updates (and the fused MLP step, train/cpu_mlp_step.cpp) run under it: a
// parameter whose gradient stays 0 (a dead ReLU unit, the weights of a pixel that is black in every
// image) has its Adam moment or SGD momentum multiplied by b1 or momentum every step, and from 1e-5
// it is subnormal after ~800 steps. Intel cores take a microcode assist for every vector
// instruction with a subnormal operand or result: on a Xeon (family 6, model 207) 12% of the seed
// MLP's first moments were subnormal by step 2,000 and the Adam update took 116 us a step thread
// instead of 24 (docs/benchmarks.md). What a subnormal moment would add to a weight is below half
// an ulp of any weight above ~1e-24, so the weights come out the same.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <xmmintrin.h>
#endif

namespace spritetorch {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
class FlushSubnormals {
 public:
  FlushSubnormals() : saved_(_mm_getcsr()) {
    _mm_setcsr(saved_ | kFlushToZero | kDenormalsAreZero);
  }
  ~FlushSubnormals() { _mm_setcsr(saved_); }
  FlushSubnormals(const FlushSubnormals&) = delete;
  FlushSubnormals& operator=(const FlushSubnormals&) = delete;

 private:
  static constexpr unsigned kFlushToZero = 0x8000, kDenormalsAreZero = 0x0040;
  unsigned saved_;
};
#else
// Other CPUs run unflushed: whether their subnormals cost is unmeasured.
struct FlushSubnormals {};
#endif

}  // namespace spritetorch
