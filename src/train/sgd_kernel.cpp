#include "train/sgd_kernel.h"

#include "common/flush_subnormals.h"

namespace spritetorch::train {

void sgd_update(float* p, const float* g, float* buf, int64_t begin, int64_t end,
                const SgdScalars& k) {
  const FlushSubnormals flush;
  const float neg_lr = -k.lr;
  // Plain loops the compiler vectorises: the update is bound by memory, not arithmetic.
  if (k.momentum == 0.0f) {
    if (k.weight_decay == 0.0f)  // no 0 * inf = NaN without decay
      for (int64_t i = begin; i < end; ++i) p[i] += neg_lr * g[i];
    else
      for (int64_t i = begin; i < end; ++i) p[i] += neg_lr * (g[i] + k.weight_decay * p[i]);
    return;
  }
  for (int64_t i = begin; i < end; ++i) {
    const float gi = k.weight_decay != 0.0f ? g[i] + k.weight_decay * p[i] : g[i];
    const float b = k.first_step ? gi : buf[i] * k.momentum + gi;
    buf[i] = b;
    p[i] += neg_lr * b;
  }
}

}  // namespace spritetorch::train
