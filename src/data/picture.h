// A picture file's pixels turned into one input of a trained model, so that `classify` serves
// every classifier: sprite models (RGBA) and the Fashion-MNIST ones (grey).
#pragma once

#include <torch/torch.h>

#include <vector>

namespace spritetorch::data {

// True for the input shapes picture_to_input serves: (4, S, S), (1, H, W) and (3, H, W).
bool takes_pictures(const std::vector<int64_t>& input_shape);

// rgba: (h, w, 4) uint8 on the CPU, as io::read_png returns it. input_shape: the model's (C, H, W).
//   C = 4 (sprite models): the RGBA pixels as they are, resized as the model's training set was
//          (`sprite_resize`, the checkpoint's sprite option: io::resize_sprites); H must equal W.
//   C = 3: RGB composited over black (alpha 0 = black), then scaled.
//   C = 1 (Fashion-MNIST models): luminance (ITU-R BT.601 weights) composited over black, since
//          Fashion-MNIST draws light items on a black ground; `invert` first turns a dark item on
//          a light ground (a product photo) into that. Then scaled.
// C = 1 and 3 are scaled down by averaging over areas (no aliasing from a large photo) and up by
// nearest neighbour. Returns (1, C, H, W) uint8; a shape no model here takes is an Error.
torch::Tensor picture_to_input(const torch::Tensor& rgba, const std::vector<int64_t>& input_shape,
                               bool invert = false, const std::string& sprite_resize = "area");

}  // namespace spritetorch::data
