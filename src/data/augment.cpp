#include "data/augment.h"

#include <sstream>

#include "common/error.h"

namespace spritetorch::data {

std::string AugmentOptions::describe() const {
  if (!enabled()) return "none";
  std::string out = flip ? "flip" : "";
  if (shift > 0) out += std::string(out.empty() ? "" : ",") + "shift " + std::to_string(shift);
  if (cutout > 0) out += std::string(out.empty() ? "" : ",") + "cutout " + std::to_string(cutout);
  return out;
}

namespace {

const char* const kExpected = "expected none, flip, shift, shift:N or cutout:N, joined by commas";

// N of "name:N": one or two digits (0 turns it off).
int amount(const std::string& item, const std::string& text, const char* what) {
  const size_t colon = item.find(':');
  const std::string digits = item.substr(colon + 1);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos)
    throw Error("unknown augmentation '" + item + "' in '" + text + "': " + kExpected);
  if (digits.size() > 2)
    throw Error("'" + item + "' in '" + text + "': expected a " + what + " of at most 99 pixels");
  return std::stoi(digits);
}

}  // namespace

AugmentOptions parse_augment(const std::string& text) {
  AugmentOptions out;
  if (text == "none" || text.empty()) return out;
  if (text.back() == ',')
    throw Error("unknown augmentation '' (after the last comma) in '" + text + "': " + kExpected);
  std::stringstream items(text);
  std::string item;
  bool shift_given = false, cutout_given = false;
  while (std::getline(items, item, ',')) {
    const bool is_shift = item == "shift" || item.rfind("shift:", 0) == 0;
    const bool is_cutout = item.rfind("cutout:", 0) == 0;
    if ((item == "flip" && out.flip) || (is_shift && shift_given) || (is_cutout && cutout_given))
      throw Error("'" + text + "' names " +
                  (is_shift    ? std::string("a shift")
                   : is_cutout ? "a cutout"
                               : item) +
                  " twice: expected each augmentation once");
    shift_given = shift_given || is_shift;
    cutout_given = cutout_given || is_cutout;
    if (item == "flip") {
      out.flip = true;
    } else if (item == "shift") {
      out.shift = 2;
    } else if (is_shift) {
      out.shift = amount(item, text, "shift");
    } else if (is_cutout) {
      out.cutout = amount(item, text, "cutout");
    } else {
      throw Error("unknown augmentation '" + item + "' in '" + text + "': " + kExpected);
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
  if (options.cutout > 0) {
    // Cutout (DeVries & Taylor, 2017): an n x n square at a per-sample centre anywhere in the
    // image, clipped at the borders, set to zero (the images' background). Rows [cy - n/2,
    // cy - n/2 + n) and the same for columns; the mask is their outer product, no loop over
    // samples.
    const int64_t n = options.cutout;
    const auto index = on_device.dtype(torch::kInt64);
    const auto top = torch::randint(0, h, {b, 1}, index) - n / 2;                 // (B, 1)
    const auto left = torch::randint(0, w, {b, 1}, index) - n / 2;                // (B, 1)
    const auto r = torch::arange(h, index).unsqueeze(0);                          // (1, H)
    const auto q = torch::arange(w, index).unsqueeze(0);                          // (1, W)
    const auto in_rows = (r >= top) & (r < top + n);                              // (B, H)
    const auto in_cols = (q >= left) & (q < left + n);                            // (B, W)
    const auto square = in_rows.view({b, 1, h, 1}) & in_cols.view({b, 1, 1, w});  // (B, 1, H, W)
    out = out.masked_fill(square, 0);
  }
  return out.contiguous();
}

}  // namespace spritetorch::data
