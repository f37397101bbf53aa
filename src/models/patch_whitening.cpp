#include "models/patch_whitening.h"

#include <algorithm>

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
  TORCH_CHECK(images.dim() == 4 && images.scalar_type() == torch::kFloat32,
              "patch_whitening_filters: images (N, C, H, W) float32");
  if (padding < 0) padding = kernel / 2;
  const int64_t dims = images.size(1) * kernel * kernel;  // one patch, flattened
  if (out % 2 != 0 || out < 2)
    throw Error(
        "whitening fills a convolution's output channels with pairs of filters; this one "
        "has " +
        std::to_string(out));
  // The patches' covariance, summed in float64 over chunks of images: (dims, dims).
  auto sum = torch::zeros({dims}, torch::kFloat64);
  auto products = torch::zeros({dims, dims}, torch::kFloat64);
  int64_t count = 0;
  for (int64_t start = 0; start < images.size(0); start += 500) {
    const int64_t n = std::min<int64_t>(500, images.size(0) - start);
    // (n, dims, L) -> (n * L, dims)
    auto p = F::unfold(images.narrow(0, start, n),
                       F::UnfoldFuncOptions(kernel).padding(padding).stride(stride))
                 .transpose(1, 2)
                 .reshape({-1, dims});
    sum += p.sum(0).to(torch::kFloat64);
    products += p.t().mm(p).to(torch::kFloat64);
    count += p.size(0);
  }
  TORCH_CHECK(count > 1, "patch_whitening_filters: no patches");
  const auto mean = sum / static_cast<double>(count);
  const auto cov = products / static_cast<double>(count) - mean.unsqueeze(1) * mean.unsqueeze(0);
  auto [values, vectors] = torch::linalg::eigh(cov, "L");  // ascending; vectors in columns
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
                              const std::string& model) {
  auto& conv = first_conv_or_throw(module, model);
  const auto& o = conv.options;
  const auto* padding = c10::get_if<torch::ExpandingArray<2>>(&o.padding());
  const int64_t k = o.kernel_size()->at(0);
  std::string unsupported;
  if (o.kernel_size()->at(1) != k) unsupported = "a non-square kernel";
  if (o.groups() != 1) unsupported = "groups";
  if (o.dilation()->at(0) != 1 || o.dilation()->at(1) != 1) unsupported = "dilation";
  if (o.stride()->at(0) != o.stride()->at(1)) unsupported = "unequal strides";
  if (o.transposed()) unsupported = "a transposed convolution";
  if (!padding || (*padding)->at(0) != (*padding)->at(1) ||
      !c10::holds_alternative<torch::enumtype::kZeros>(o.padding_mode()))
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
  const auto x = data::to_model_input(images.narrow(0, 0, n)).contiguous();
  torch::Tensor filters;
  try {
    filters = patch_whitening_filters(x, o.out_channels(), k, (*padding)->at(0), o.stride()->at(0));
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
