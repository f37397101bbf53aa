#include "data/procedural_sprites.h"

#include <array>
#include <cmath>
#include <random>

#include "common/error.h"

namespace spritetorch::data {

namespace {

// Left halves (16 rows x 8 columns; column 7 meets the mirror axis). '.' empty, '#' body,
// '?' body or empty at random, 'e' an accent pixel (eyes, windows, a label), '*' accent or empty.
// Row 15 and column 0 hold no body, so the outline fits inside the 16x16 tile (one robot's
// antenna tip touches row 0 and has no outline above it).
using Mask = std::array<const char*, 16>;

const std::vector<std::vector<Mask>>& mask_families() {
  static const std::vector<std::vector<Mask>> kFamilies = {
      // spaceship: pointed nose, wide wings at the back
      {{"........", ".......#", "......?#", "......#e", ".....?#e", ".....?##", "....??##",
        "...???##", "..????##", ".?????##", ".?###?##", ".??##?##", ".?#..?##", ".?...??#",
        "......?*", "........"},
       {"........", "........", "......?#", "......#e", "......#e", ".....?##", "....?###",
        "..???###", ".??####?", ".?#??###", ".?#.?###", ".??.?###", "....??##", ".....?##",
        "......?*", "........"}},
      // creature: round body, two eyes, legs
      {{"........", "........", "....????", "...?####", "..?#####", "..?#ee##", "..?#ee##",
        "..?#####", ".??#####", ".?######", ".??##***", "..?#####", "..??##??", "...?#..?",
        "...??..?", "........"},
       {"........", "...?....", "...??.??", "...?####", "..?#####", "..#?e###", "..##e###",
        ".?######", ".?######", ".?##****", ".?######", "..?#####", "...##?##", "...#?.?#",
        "..??...?", "........"}},
      // robot: square head with antenna, box body, straight legs
      {{"........", "......?#", ".......#", "...#####", "...#ee##", "...#ee##", "...#####",
        "....?###", ".?######", ".?#*####", ".?.#####", ".?.#####", "...#####", "...##.##",
        "..???.??", "........"},
       {".......?", ".......#", "..######", "..#ee###", "..#ee###", "..######", "...?####",
        "..######", ".?##*###", ".?######", ".?.?####", "...#####", "...##..#", "...##..#",
        "..???..?", "........"}},
      // item: a potion or a gem, small and centred
      {{"........", "........", "......??", ".....?##", "......##", ".....###", "....####",
        "...?####", "...#####", "...##ee#", "...#####", "...?####", "....?###", ".....?##",
        "........", "........"},
       {"........", "........", "........", ".....?##", "....?###", "...?####", "...#####",
        "...##e##", "...?####", "....?###", ".....###", "......##", "......?#", "........",
        "........", "........"}},
  };
  return kFamilies;
}

struct Rgb {
  double r, g, b;
};

Rgb hsv(double h, double s, double v) {
  h = std::fmod(h, 1.0) * 6.0;
  const int i = static_cast<int>(h);
  const double f = h - i, p = v * (1 - s), q = v * (1 - s * f), t = v * (1 - s * (1 - f));
  switch (i % 6) {
    case 0:
      return {v, t, p};
    case 1:
      return {q, v, p};
    case 2:
      return {p, v, t};
    case 3:
      return {p, q, v};
    case 4:
      return {t, p, v};
    default:
      return {v, p, q};
  }
}

uint8_t to_byte(double x) {
  return static_cast<uint8_t>(std::lround(std::clamp(x, 0.0, 1.0) * 255.0));
}

}  // namespace

const std::vector<std::string>& procedural_sprite_classes() {
  static const std::vector<std::string> kNames = {"spaceship", "creature", "robot", "item"};
  return kNames;
}

Dataset make_procedural_sprites(int64_t count, uint64_t seed) {
  if (count <= 0)
    throw Error("procedural sprites: count must be positive, got " + std::to_string(count));
  constexpr int64_t S = kProceduralSpriteSize;
  const auto& families = mask_families();
  const int64_t classes = static_cast<int64_t>(families.size());
  auto inputs = torch::zeros({count, 4, S, S}, torch::kUInt8);
  auto labels = torch::empty({count}, torch::kInt64);
  auto px = inputs.accessor<uint8_t, 4>();
  auto lab = labels.accessor<int64_t, 1>();
  for (int64_t i = 0; i < count; ++i) {
    // One engine per sprite, seeded from (seed, i): sprite i never depends on the count.
    std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                      static_cast<uint32_t>(i), static_cast<uint32_t>(i >> 32), 0x5471u};
    std::mt19937 rng(seq);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    const int64_t cls = i % classes;
    const auto& family = families[static_cast<size_t>(cls)];
    const Mask& mask = family[static_cast<size_t>(rng() % family.size())];
    const double fill = 0.35 + 0.3 * u(rng);  // how often a '?' cell becomes body

    // 0 empty, 1 body, 2 accent, 3 outline; the left half is drawn, then mirrored.
    std::array<std::array<int, S>, S> cell{};
    for (int y = 0; y < S; ++y)
      for (int x = 0; x < S / 2; ++x) {
        const char c = mask[y][x];
        int v = 0;
        if (c == '#')
          v = 1;
        else if (c == '?')
          v = u(rng) < fill ? 1 : 0;
        else if (c == 'e')
          v = 2;
        else if (c == '*')
          v = u(rng) < 0.5 ? 2 : 1;
        cell[y][x] = v;
        cell[y][S - 1 - x] = v;
      }
    // Outline: every empty pixel with a 4-neighbour in the sprite.
    for (int y = 0; y < S; ++y)
      for (int x = 0; x < S; ++x) {
        if (cell[y][x] != 0) continue;
        const bool touches = (y > 0 && (cell[y - 1][x] == 1 || cell[y - 1][x] == 2)) ||
                             (y < S - 1 && (cell[y + 1][x] == 1 || cell[y + 1][x] == 2)) ||
                             (x > 0 && (cell[y][x - 1] == 1 || cell[y][x - 1] == 2)) ||
                             (x < S - 1 && (cell[y][x + 1] == 1 || cell[y][x + 1] == 2));
        if (touches) cell[y][x] = 4;  // 4 marks a fresh outline pixel (not a neighbour source)
      }
    // Palette: a body hue with three shades (light from the top), an accent hue, a dark outline.
    const double hue = u(rng), sat = 0.45 + 0.5 * u(rng), val = 0.65 + 0.35 * u(rng);
    const double accent_hue = hue + 0.33 + 0.34 * u(rng);
    const Rgb shades[3] = {hsv(hue, sat * 0.8, val), hsv(hue, sat, val * 0.78),
                           hsv(hue, sat, val * 0.55)};
    const Rgb accent = hsv(accent_hue, 0.5 + 0.5 * u(rng), 0.85 + 0.15 * u(rng));
    const Rgb outline = hsv(hue, sat * 0.6, 0.12 + 0.12 * u(rng));
    for (int y = 0; y < S; ++y)
      for (int x = 0; x < S; ++x) {
        const int v = cell[y][x];
        if (v == 0) continue;
        Rgb c = outline;
        if (v == 1) c = shades[y < 6 ? 0 : (y < 11 ? 1 : 2)];
        if (v == 2) c = accent;
        px[i][0][y][x] = to_byte(c.r);
        px[i][1][y][x] = to_byte(c.g);
        px[i][2][y][x] = to_byte(c.b);
        px[i][3][y][x] = 255;
      }
    lab[i] = cls;
  }
  Dataset out;
  out.inputs = inputs;
  out.labels = labels;
  out.class_names = procedural_sprite_classes();
  out.name = "sprites";
  return out;
}

}  // namespace spritetorch::data
