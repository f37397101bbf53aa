// A process group of torch.distributed's c10d: rendezvous through a c10d::TCPStore hosted by
// rank 0, then ProcessGroupGloo (CPU tensors; also CUDA tensors) or ProcessGroupNCCL (CUDA builds).
// The c10d types stay in communicator.cpp, so this header compiles everywhere; when spritetorch was
// built without c10d Gloo (SPRITETORCH_WITH_GLOO 0) create() throws a clear error instead.
//
// Every collective must be called by all ranks in the same order (c10d matches them by sequence).
// Failures (a rank that died, a collective that outlived the timeout) surface as spritetorch::Error
// naming this rank and the operation, never as a hang: every wait is bounded by the timeout.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "distributed/dist_env.h"

namespace spritetorch::distributed {

struct CommOptions {
  std::string backend = "gloo";  // gloo | nccl
  double timeout_s = 300;        // rendezvous, connection setup and every collective
};

// True when this build has c10d with Gloo; backends() lists what create() accepts.
bool distributed_available();
std::vector<std::string> backends();

// One collective in flight. wait() blocks until it is done (or throws on failure or timeout).
class PendingOp {
 public:
  virtual ~PendingOp() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string backend() const = 0;

  // In place, blocking: every rank ends with the sum over ranks.
  virtual void allreduce_sum(torch::Tensor& tensor) = 0;
  // In place, asynchronous; `tensor` must stay alive and untouched until wait().
  virtual std::unique_ptr<PendingOp> allreduce_sum_async(torch::Tensor tensor) = 0;
  // In place, blocking: every rank ends with `root`'s values.
  virtual void broadcast(torch::Tensor& tensor, int root) = 0;
  virtual void barrier() = 0;
};

// --dist-timeout's range, checked before any rank waits: under a second a rendezvous cannot finish
// (0.000001 s became a 0 s timeout and the raw "client socket has timed out after 0s"), and past a
// year Gloo's millisecond count overflowed into "Invalid timeout". Throws Error naming the value.
void check_dist_timeout(double seconds);

// Rendezvous and process group for `env`. Rank 0 hosts the TCPStore on MASTER_PORT; the others
// connect to MASTER_ADDR:MASTER_PORT. Throws spritetorch::Error when the master cannot be reached,
// not every rank arrives within the timeout, or the backend is unknown or not built.
std::shared_ptr<Communicator> create_communicator(const DistEnv& env, const CommOptions& options);

}  // namespace spritetorch::distributed
