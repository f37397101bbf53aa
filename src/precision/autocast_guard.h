// An RAII autocast scope, the C++ twin of Python's `with torch.autocast(device_type, dtype)`.
// LibTorch's C++ API has only the global setters (pytorch/pytorch#44710); this guard sets them for
// one device type and puts back exactly what it found, so guards nest:
//
//   {
//     precision::AutocastGuard bf16(c10::DeviceType::CPU, torch::kBFloat16);
//     auto logits = model->forward(x);    // matmuls and convs in bf16, softmax etc. in fp32
//     {
//       precision::AutocastGuard off(c10::DeviceType::CPU, torch::kBFloat16, /*enabled=*/false);
//       ...                                // fp32 again
//     }                                    // bf16 autocast again
//   }                                      // the state before the outer guard
//   loss.backward();                       // backward outside the guard, as in PyTorch
//
// The outermost guard clears autocast's cache of casted weights on exit (as Python does), so a
// weight updated in place by the optimizer is cast afresh in the next forward.
#pragma once

#include <torch/torch.h>

namespace spritetorch::precision {

class AutocastGuard {
 public:
  // Throws spritetorch::Error for a device type without autocast support (see compat.h). On the
  // CPU, LibTorch 1.13 accepts only bf16 (its error names the rule); enabled=false ignores dtype.
  // cache_enabled=false is what CUDA graph capture needs (casts must be recorded in the graph).
  AutocastGuard(c10::DeviceType device_type, torch::ScalarType dtype, bool enabled = true,
                bool cache_enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_type_;
  bool previous_enabled_;
  torch::ScalarType previous_dtype_;
  bool previous_cache_enabled_;
};

}  // namespace spritetorch::precision
