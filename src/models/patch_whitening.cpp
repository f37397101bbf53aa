#include "models/patch_whitening.h"

#include <algorithm>

#include "common/compat.h"
#include "common/error.h"
#include "data/dataset.h"

namespace spritetorch::models {

namespace {

namespace F = torch::nn::functional;

// The module's first Conv2d in registration order (null when it has none).
torch::nn::Conv2dImpl* first_conv(torch::nn::Module& module) {
  for (const auto& m : module.modules(/*include_self=*/true))
    if (auto* conv = m->as<torch::nn::Conv2d>()) return conv;
  return nullptr;
}

torch::nn::Conv2dImpl& first_conv_or_throw(torch::nn::Module& module, const std::string& model) {
  auto* conv = first_conv(module);
  if (!conv)
    throw Error(
        "--first-conv whitened sets a model's first convolution; model " + model + " has no Conv2d",
        "use --first-conv learned, or a convolutional model (fastcnn)");
  return *conv;
}

}  // namespace

torch::Tensor patch_whitening_filters(const torch::Tensor& images, int64_t out, int64_t kernel,
                                      int64_t padding, int64_t stride, double eps) {
  TORCH_CHECK(
      images.dim() == 4 && images.size(0) > 0 &&
          (images.scalar_type() == torch::kFloat32 || images.scalar_type() == torch::kUInt8),
      "patch_whitening_filters: images (N, C, H, W) float32 or uint8");
  if (padding < 0) padding = kernel / 2;
  const int64_t dims = images.size(1) * kernel * kernel;  // one patch, flattened
  TORCH_CHECK(kernel > 0 && stride > 0, "patch_whitening_filters: kernel and stride >= 1");
  if (out % 2 != 0 || out < 2)
    throw Error(
        "whitening fills a convolution's output channels with pairs of filters; this one "
        "has " +
        std::to_string(out));
  const int64_t rows = (images.size(2) + 2 * padding - kernel) / stride + 1;
  const int64_t cols = (images.size(3) + 2 * padding - kernel) / stride + 1;
  if (images.size(2) + 2 * padding < kernel || images.size(3) + 2 * padding < kernel)
    throw Error("images of " + std::to_string(images.size(2)) + "x" +
                std::to_string(images.size(3)) + " pixels hold no " + std::to_string(kernel) + "x" +
                std::to_string(kernel) + " patches");
  // The patches' covariance: (dims, dims) float64 on the CPU, from sums over chunks of images.
  // A chunk's patches are the padded images shifted by each of the k x k offsets, stacked as
  // (C k^2, n, rows * cols): the order F::unfold gives a patch's values (channel, then row, then
  // column), built from contiguous pixel rows. unfold itself and a (patches, dims) layout both
  // cost more than the products: 5,000 Fashion-MNIST images take 0.07-0.11 s this way in a `train`
  // process on 2 Zen 5 cores, 0.30-0.44 s as (patches, dims) rows from unfold. A chunk is ~80,000
  // patches on the CPU, which stay in its caches, and ~4 M on CUDA (all 5,000 of those images in
  // one go; 64x64 RGB sprites ~1,000 a chunk, 0.4 GB).
  const int64_t per_image = rows * cols;
  const int64_t chunk = std::max<int64_t>(
      1, (images.is_cuda() ? 4'000'000 : 80'000) / per_image);  // per_image >= 1: checked above
  const auto totals = images.options().dtype(torch::kFloat64);
  auto sum = torch::zeros({dims}, totals);
  auto products = torch::zeros({dims, dims}, totals);
  for (int64_t start = 0; start < images.size(0); start += chunk) {
    const int64_t n = std::min(chunk, images.size(0) - start);
    // (C, n, H + 2 padding, W + 2 padding), converted here rather than all at once: a fresh
    // float copy of 5,000 images costs ~0.05 s in page faults alone on a VM
    const auto padded = F::pad(data::to_model_input(images.narrow(0, start, n)).transpose(0, 1),
                               F::PadFuncOptions({padding, padding, padding, padding}));
    std::vector<torch::Tensor> shifted;  // k^2 views (C, n, rows, cols)
    for (int64_t dy = 0; dy < kernel; ++dy)
      for (int64_t dx = 0; dx < kernel; ++dx)
        shifted.push_back(padded.slice(2, dy, dy + (rows - 1) * stride + 1, stride)
                              .slice(3, dx, dx + (cols - 1) * stride + 1, stride));
    // (dims, n, L) -> viewed as (n, dims, L): a batched product per image, each (dims, dims)
    const auto p = torch::stack(shifted, 1).reshape({dims, n, per_image}).transpose(0, 1);
    sum += p.sum(2).to(torch::kFloat64).sum(0);
    products += torch::bmm(p, p.transpose(1, 2)).to(torch::kFloat64).sum(0);
  }
  const int64_t count = images.size(0) * per_image;
  // The eigendecomposition of a 9 x 9 (or so) matrix: on the CPU, where it needs no solver library
  // to start.
  const auto mean = sum.cpu() / static_cast<double>(count);
  const auto cov =
      products.cpu() / static_cast<double>(count) - mean.unsqueeze(1) * mean.unsqueeze(0);
  auto [values, vectors] = torch::linalg_eigh(cov, "L");  // ascending; vectors in columns
  const int64_t half = out / 2;
  const int64_t kept = std::min(half, dims);
  // The `kept` largest, largest first: (kept, dims) rows.
  auto top = vectors.narrow(1, dims - kept, kept).flip({1}).t().contiguous();
  auto top_values = values.narrow(0, dims - kept, kept).flip({0}).clamp_min(0);
  if (kept < half) {  // more channels than directions: they repeat in order (i mod dims)
    const auto repeat = torch::arange(half, torch::kLong).remainder(kept);
    top = top.index_select(0, repeat);
    top_values = top_values.index_select(0, repeat);
  }
  // A direction's sign is LAPACK's choice: make its largest component positive, so that every
  // build (and the Python peer) gets the same filters.
  const auto largest = top.abs().argmax(1, /*keepdim=*/true);
  top = top * top.gather(1, largest).sign();
  top = top / (top_values + eps).sqrt().unsqueeze(1);
  return torch::cat({top, -top})
      .to(torch::kFloat32)
      .reshape({out, images.size(1), kernel, kernel})
      .contiguous();
}

std::string whiten_first_conv(torch::nn::Module& module, const torch::Tensor& images,
                              const std::string& model, torch::Device device) {
  auto& conv = first_conv_or_throw(module, model);
  const auto& o = conv.options;
  const auto* padding = compat::variant_get_if<torch::ExpandingArray<2>>(o.padding());
  const int64_t k = o.kernel_size()->at(0);
  std::string unsupported;
  if (o.kernel_size()->at(1) != k) unsupported = "a non-square kernel";
  if (o.groups() != 1) unsupported = "groups";
  if (o.dilation()->at(0) != 1 || o.dilation()->at(1) != 1) unsupported = "dilation";
  if (o.stride()->at(0) != o.stride()->at(1)) unsupported = "unequal strides";
  if (o.transposed()) unsupported = "a transposed convolution";
  if (!padding || (*padding)->at(0) != (*padding)->at(1) ||
      !compat::variant_holds<torch::enumtype::kZeros>(o.padding_mode()))
    unsupported = "padding other than equal zeros on each side";
  if (!unsupported.empty())
    throw Error("--first-conv whitened: model " + model + "'s first convolution has " +
                unsupported + "; whitening takes square patches at one stride");
  if (images.dim() != 4 || images.size(1) != o.in_channels())
    throw Error("--first-conv whitened: model " + model + "'s first convolution takes " +
                std::to_string(o.in_channels()) + " channel(s) of images; the training set holds " +
                (images.dim() == 4 ? std::to_string(images.size(1)) + " channel(s)"
                                   : std::string("feature vectors")));
  const int64_t n = std::min<int64_t>(kWhiteningImages, images.size(0));
  torch::Tensor filters;
  try {
    filters = patch_whitening_filters(images.narrow(0, 0, n).to(device), o.out_channels(), k,
                                      (*padding)->at(0), o.stride()->at(0));
  } catch (const Error& e) {
    throw Error("--first-conv whitened: model " + model + "'s first convolution: " + e.what(),
                "use --first-conv learned");
  }
  {
    torch::NoGradGuard no_grad;
    conv.weight.copy_(filters);
    if (conv.bias.defined()) conv.bias.zero_();
  }
  freeze_first_conv(module, model);
  const int64_t pairs = o.out_channels() / 2, directions = o.in_channels() * k * k;
  return "whitened " + std::to_string(k) + "x" + std::to_string(k) + " patches of the first " +
         std::to_string(n) + " training images, frozen (" +
         (pairs <= directions ? std::to_string(pairs) + " directions"
                              : "their " + std::to_string(directions) + " directions repeated to " +
                                    std::to_string(pairs)) +
         ", and their negatives)";
}

void freeze_first_conv(torch::nn::Module& module, const std::string& model) {
  auto& conv = first_conv_or_throw(module, model);
  conv.weight.set_requires_grad(false);
  if (conv.bias.defined()) conv.bias.set_requires_grad(false);
}

}  // namespace spritetorch::models
