#include "data/augment.h"

#include <sstream>

#include "common/error.h"

namespace spritetorch::data {

std::string AugmentOptions::describe() const {
  if (!enabled()) return "none";
  std::string out = flip ? "flip" : "";
  if (shift > 0) out += std::string(flip ? "," : "") + "shift " + std::to_string(shift);
  return out;
}

AugmentOptions parse_augment(const std::string& text) {
  AugmentOptions out;
  if (text == "none" || text.empty()) return out;
  if (text.back() == ',')
    throw Error("unknown augmentation '' (after the last comma) in '" + text +
                "': expected none, flip, shift or shift:N, joined by commas");
  std::stringstream items(text);
  std::string item;
  bool shift_given = false;
  while (std::getline(items, item, ',')) {
    const bool is_shift = item.rfind("shift", 0) == 0;
    if ((item == "flip" && out.flip) || (is_shift && shift_given))
      throw Error("'" + text + "' names " + (is_shift ? std::string("a shift") : item) +
                  " twice: expected each augmentation once");
    shift_given = shift_given || is_shift;
    if (item == "flip") {
      out.flip = true;
    } else if (item == "shift") {
      out.shift = 2;
    } else if (item.rfind("shift:", 0) == 0 && item.size() > 6 &&
               item.find_first_not_of("0123456789", 6) == std::string::npos) {
      if (item.size() > 8)  // more than two digits
        throw Error("'" + item + "' in '" + text + "': expected a shift of at most 99 pixels");
      out.shift = std::stoi(item.substr(6));
    } else {
      throw Error("unknown augmentation '" + item + "' in '" + text +
                  "': expected none, flip, shift or shift:N, joined by commas");
    }
  }
  return out;
}

torch::Tensor augment_batch(const torch::Tensor& x, const AugmentOptions& options) {
  TORCH_CHECK(x.dim() == 4, "augment_batch wants (B, C, H, W), got ", x.sizes());
  const int64_t b = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const auto on_device = torch::TensorOptions().device(x.device());
  torch::Tensor out = x;
  if (options.flip) {
    const auto mirror = (torch::rand({b, 1, 1, 1}, on_device) < 0.5);  // (B,1,1,1) bool
    out = torch::where(mirror, out.flip({3}), out);
  }
  if (options.shift > 0) {
    const int64_t s = options.shift;
    // Pad by s on every side, then read an HxW window at a per-sample offset in [0, 2s]: two
    // gathers with per-sample index grids instead of a loop over samples.
    const auto padded = torch::constant_pad_nd(out, {s, s, s, s}, 0);  // (B, C, H+2s, W+2s)
    const auto offsets = torch::randint(0, 2 * s + 1, {2, b}, on_device.dtype(torch::kInt64));
    const auto rows = torch::arange(h, on_device.dtype(torch::kInt64)).unsqueeze(0) +
                      offsets[0].unsqueeze(1);  // (B, H)
    const auto cols = torch::arange(w, on_device.dtype(torch::kInt64)).unsqueeze(0) +
                      offsets[1].unsqueeze(1);  // (B, W)
    auto picked_rows =
        padded.gather(2, rows.view({b, 1, h, 1}).expand({b, c, h, w + 2 * s}));  // (B, C, H, W+2s)
    out = picked_rows.gather(3, cols.view({b, 1, 1, w}).expand({b, c, h, w}));   // (B, C, H, W)
  }
  return out.contiguous();
}

}  // namespace spritetorch::data
