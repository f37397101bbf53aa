// The built-in dataset: procedural 16x16 RGBA pixel-art sprites in four classes (spaceship,
// creature, robot, item). Each class has its own family of half-masks; a sprite is one mask with
// its random cells drawn, mirrored left to right, outlined, and coloured from a random palette on a
// transparent background. Deterministic: sprite i depends only on (seed, i), so any count is a
// prefix of a larger one, and classes are balanced (sprite i has class i % 4).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace spritetorch::data {

constexpr int64_t kProceduralSpriteSize = 16;

const std::vector<std::string>& procedural_sprite_classes();

// count sprites: inputs (count, 4, 16, 16) uint8 RGBA (alpha 0 or 255), labels (count) int64.
Dataset make_procedural_sprites(int64_t count, uint64_t seed);

}  // namespace spritetorch::data
