// The pictures of a run folder, drawn by gnuplot: for each, a data file and a gnuplot script under
// <run>/plots/, written here; runs/gnuplot.h runs them with the run folder as working directory
// (so `cd <run> && gnuplot plots/curves.gp` redraws a picture by hand). File names and every
// string from the data (class names) reach the scripts through gnuplot_quote only.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "train/trainer.h"

namespace spritetorch::runs {

struct CurvePoints {
  struct Log {
    double epoch = 0;  // fractional: (epoch - 1) + step / steps
    double loss = 0;
  };
  struct Epoch {
    int64_t epoch = 0;
    double loss = 0, accuracy = 0;
    bool has_test = false;
    double test_loss = 0, test_accuracy = 0;
  };
  struct Test {
    double epoch = 0;  // fractional: epochs done when the test set was evaluated
    double loss = 0, accuracy = 0;
  };
  std::vector<Log> logs;
  std::vector<Epoch> epochs;
  std::vector<Test> tests;  // every test evaluation, per epoch and within epochs, in order
  bool accuracy = true;     // classifiers: an accuracy panel; generators: loss only
};

// A script and the picture it draws, both relative to the run folder.
struct PlotScript {
  std::string script;   // e.g. plots/curves.gp
  std::string picture;  // e.g. curves.png
};

// Loss (and accuracy) against epochs: train per --log-every interval and per epoch, test at every
// evaluation (points.tests: epoch ends and --eval-every-steps). Nothing to draw (no epoch) gives an
// empty script.
PlotScript write_curves_plot(const std::string& folder, const CurvePoints& points,
                             const std::string& title);
// Heatmap of the (K, K) int64 confusion matrix (rows true, columns predicted): colour = share of
// the row, every cell labelled with its count, axes with the class names.
PlotScript write_confusion_plot(const std::string& folder, const torch::Tensor& confusion,
                                const std::vector<std::string>& class_names);
// Grid of misclassified test images, each with its true and predicted class. Empty script when
// there is nothing to show or the samples are not images; `why_not` then says why.
PlotScript write_misclassified_plot(const std::string& folder, const train::Misclassified& wrong,
                                    const std::vector<std::string>& class_names,
                                    std::string* why_not);

// (N, C, H, W) uint8 samples (C = 1 grey, 3 RGB, 4 RGBA) -> (N, H, W, 3) uint8 RGB, transparency
// composited onto white. On the CPU.
torch::Tensor to_rgb_on_white(const torch::Tensor& images);

}  // namespace spritetorch::runs
