#include "runs/plots.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "runs/gnuplot.h"

namespace spritetorch::runs {

namespace {

namespace fs = std::filesystem;

void write_text(const std::string& path, const std::string& text) {
  errno = 0;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.flush();
  if (!out) {
    const std::string reason = errno != 0 ? std::strerror(errno) : "the stream failed";
    throw Error("could not write " + path + ": " + reason, make_room_hint(reason));
  }
}

std::string number(double v) {
  if (!std::isfinite(v)) return "?";  // gnuplot: `set datafile missing '?'`
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.6g", v);
  return buffer;
}

std::string plots_dir(const std::string& folder) {
  fs::create_directories(fs::path(folder) / "plots");
  return (fs::path(folder) / "plots").string();
}

std::string class_name(const std::vector<std::string>& names, int64_t k) {
  std::string name = k >= 0 && static_cast<size_t>(k) < names.size() ? names[static_cast<size_t>(k)]
                                                                     : std::to_string(k);
  if (name.size() > 18) name = name.substr(0, 17) + "~";  // keeps grid cells and tics readable
  return name;
}

// Common head of every script: a PNG of the given pixel size, text as written (no enhanced-text
// markup, so '_' or '^' in a class name stay themselves). The picture goes where the variable
// `picture` says when the caller sets it (`gnuplot -e "picture='...'"`: the run folder draws
// under a temporary name), else to its own name (a redraw by hand).
std::string script_head(const std::string& picture, int width, int height, int font_size) {
  return "set terminal pngcairo noenhanced size " + std::to_string(width) + "," +
         std::to_string(height) + " font " + gnuplot_quote("sans," + std::to_string(font_size)) +
         "\nif (!exists(\"picture\")) picture = " + gnuplot_quote(picture) +
         "\nset output picture\nset datafile missing '?'\n";
}

}  // namespace

PlotScript write_curves_plot(const std::string& folder, const CurvePoints& points,
                             const std::string& title) {
  if (points.epochs.empty()) return {};
  const std::string dir = plots_dir(folder);
  std::string logs = "# epoch(fractional) running_loss\n";
  for (const auto& l : points.logs) logs += number(l.epoch) + " " + number(l.loss) + "\n";
  std::string epochs = "# epoch train_loss train_accuracy test_loss test_accuracy\n";
  for (const auto& e : points.epochs) {
    epochs += std::to_string(e.epoch) + " " + number(e.loss) + " " + number(e.accuracy) + " " +
              (e.has_test ? number(e.test_loss) : "?") + " " +
              (e.has_test ? number(e.test_accuracy) : "?") + "\n";
  }
  write_text(dir + "/curves_steps.dat", logs);
  write_text(dir + "/curves_epochs.dat", epochs);
  // The test curve from its own file: --eval-every-steps evaluates within epochs too.
  std::string tests = "# epoch(fractional) test_loss test_accuracy\n";
  for (const auto& t : points.tests)
    tests += number(t.epoch) + " " + number(t.loss) + " " + number(t.accuracy) + "\n";
  const bool any_test = !points.tests.empty();
  write_text(dir + "/curves_tests.dat", tests);

  const std::string steps_file = gnuplot_quote("plots/curves_steps.dat");
  const std::string epochs_file = gnuplot_quote("plots/curves_epochs.dat");
  const std::string tests_file = gnuplot_quote("plots/curves_tests.dat");
  const bool panels = points.accuracy;
  std::ostringstream s;
  s << script_head("curves.png", panels ? 1280 : 720, 480, 11);
  s << "set grid lc rgb '#dddddd'\nset key top right box opaque\nset xlabel 'epoch'\n"
    << "set xrange [0:" << std::max<int64_t>(points.epochs.back().epoch, 1)
    << "]\nset offsets 0, 0, graph 0.05, graph 0.05\n";
  if (panels)
    s << "set multiplot layout 1,2 title " << gnuplot_quote(title) << "\n";
  else
    s << "set title " << gnuplot_quote(title) << "\n";
  s << "set ylabel " << gnuplot_quote(panels ? "loss (cross-entropy)" : "loss (noise MSE)") << "\n";
  if (panels) s << "set title 'loss'\n";
  // Each series only when it has points: gnuplot stops at a plot with no data.
  std::vector<std::string> series;
  if (!points.logs.empty())
    series.push_back(
        steps_file +
        " using 1:2 with lines lw 1 lc rgb '#9ecae1' title 'train (running, per log interval)'");
  series.push_back(
      epochs_file +
      " using 1:2 with linespoints lw 2 pt 7 lc rgb '#08519c' title 'train (epoch mean)'");
  if (any_test)
    series.push_back(tests_file +
                     " using 1:2 with linespoints lw 2 pt 5 lc rgb '#e6550d' title 'test'");
  s << "plot ";
  for (size_t i = 0; i < series.size(); ++i) s << (i ? ", \\\n     " : "") << series[i];
  s << "\n";
  if (panels) {
    s << "set title 'accuracy'\nset ylabel 'accuracy'\nset key bottom right\n"
      << "plot " << epochs_file
      << " using 1:3 with linespoints lw 2 pt 7 lc rgb '#08519c' title 'train (epoch, train mode)'";
    if (any_test)
      s << ", \\\n     " << tests_file
        << " using 1:3 with linespoints lw 2 pt 5 lc rgb '#e6550d' title 'test'";
    s << "\nunset multiplot\n";
  }
  write_text(dir + "/curves.gp", s.str());
  return {"plots/curves.gp", "curves.png"};
}

PlotScript write_confusion_plot(const std::string& folder, const torch::Tensor& confusion,
                                const std::vector<std::string>& class_names) {
  if (!confusion.defined() || confusion.dim() != 2 || confusion.size(0) == 0) return {};
  const std::string dir = plots_dir(folder);
  const auto counts = confusion.to(torch::kInt64).contiguous();  // (K, K)
  const int64_t k = counts.size(0);
  const auto* c = counts.data_ptr<int64_t>();
  int64_t total = 0, correct = 0;
  std::string share_text, count_text;
  std::vector<double> share(static_cast<size_t>(k * k), 0.0);
  for (int64_t i = 0; i < k; ++i) {
    int64_t row = 0;
    for (int64_t j = 0; j < k; ++j) row += c[i * k + j];
    total += row;
    correct += c[i * k + i];
    for (int64_t j = 0; j < k; ++j) {
      share[static_cast<size_t>(i * k + j)] =
          row ? static_cast<double>(c[i * k + j]) / static_cast<double>(row) : 0.0;
      share_text += (j ? " " : "") + number(share[static_cast<size_t>(i * k + j)]);
      count_text += (j ? " " : "") + std::to_string(c[i * k + j]);
    }
    share_text += "\n";
    count_text += "\n";
  }
  write_text(dir + "/confusion_share.dat", share_text);
  write_text(dir + "/confusion.dat", count_text);  // the counts, for reading by eye or by script

  // Past 30 classes the cells are too small for their counts, and a label per cell made the
  // script grow as K^2 (500 classes: 13.6 MB and more than gnuplot's minute): the picture keeps
  // to about 760 pixels, without counts, naming every n-th class.
  const bool counts_in_cells = k <= 30;
  const int cell = k <= 12           ? 64
                   : counts_in_cells ? std::max(24, 760 / static_cast<int>(k))
                                     : std::max(1, 760 / static_cast<int>(k));
  const int64_t tic_every = std::max<int64_t>(1, k / 30);
  const int side = cell * static_cast<int>(k);
  std::ostringstream s;
  s << script_head("confusion.png", side + 330, side + 220, k <= 12 ? 11 : 8);
  char accuracy[32];
  std::snprintf(accuracy, sizeof accuracy, "%.4f",
                total ? static_cast<double>(correct) / static_cast<double>(total) : 0.0);
  s << "set title "
    << gnuplot_quote("Confusion matrix, test set: " + std::to_string(total) +
                     " samples, accuracy " + accuracy)
    << "\nunset key\nset size ratio -1\nset tics scale 0\n"
    << "set xrange [-0.5:" << k - 0.5 << "]\nset yrange [" << k - 0.5 << ":-0.5]\n"
    << "set xlabel 'predicted class'\nset ylabel 'true class'\n"
    << "set cbrange [0:1]\nset cblabel 'share of the true class'\n"
    << "set palette defined (0 '#ffffff', 0.5 '#6baed6', 1 '#08306b')\n";
  std::string tics;
  for (int64_t i = 0; i < k; i += tic_every)
    tics += (i ? ", " : "") + gnuplot_quote(class_name(class_names, i)) + " " + std::to_string(i);
  s << "set xtics (" << tics << ") rotate by 35 right\nset ytics (" << tics << ")\n";
  // Counts as labels, white on dark cells; colours decided here so the script stays plain.
  for (int64_t i = 0; i < k && counts_in_cells; ++i)
    for (int64_t j = 0; j < k; ++j)
      s << "set label " << gnuplot_quote(std::to_string(c[i * k + j])) << " at " << j << "," << i
        << " center front tc rgb "
        << (share[static_cast<size_t>(i * k + j)] > 0.55 ? "'#ffffff'" : "'#000000'") << "\n";
  s << "plot " << gnuplot_quote("plots/confusion_share.dat") << " matrix with image\n";
  write_text(dir + "/confusion.gp", s.str());
  return {"plots/confusion.gp", "confusion.png"};
}

torch::Tensor to_rgb_on_white(const torch::Tensor& images) {
  auto x = images.cpu().to(torch::kFloat32);  // (N, C, H, W)
  const int64_t channels = x.size(1);
  torch::Tensor rgb, alpha;
  if (channels == 1 || channels == 2)
    rgb = x.narrow(1, 0, 1).expand({-1, 3, -1, -1});
  else
    rgb = x.narrow(1, 0, 3);
  if (channels == 2 || channels == 4) alpha = x.narrow(1, channels - 1, 1) / 255.0;
  if (alpha.defined()) rgb = rgb * alpha + 255.0 * (1.0 - alpha);
  return rgb.round().clamp(0, 255).to(torch::kUInt8).permute({0, 2, 3, 1}).contiguous();  // (N, H,
                                                                                          // W, 3)
}

PlotScript write_misclassified_plot(const std::string& folder, const train::Misclassified& wrong,
                                    const std::vector<std::string>& class_names,
                                    std::string* why_not) {
  auto say = [&](const std::string& why) {
    if (why_not) *why_not = why;
    return PlotScript{};
  };
  if (!wrong.inputs.defined() || wrong.inputs.size(0) == 0)
    return say("no test sample was misclassified");
  if (wrong.inputs.dim() != 4 || wrong.inputs.scalar_type() != torch::kUInt8 ||
      wrong.inputs.size(1) > 4)
    return say("the samples are not images (shape " + c10::str(wrong.inputs.sizes()) + ")");
  const std::string dir = plots_dir(folder);
  const int64_t n = wrong.inputs.size(0), h = wrong.inputs.size(2), w = wrong.inputs.size(3);
  // Each image drawn at about 112 pixels, every image pixel a square of scale x scale screen
  // pixels. The data file holds the images at their own size, one after another, and gnuplot
  // scales them: a canvas of scaled images (2.4 MB for 36 Fashion-MNIST images) took it 0.38 s to
  // read and draw against 0.09 s for the images as they are.
  const int64_t scale =
      std::max<int64_t>(1, std::llround(112.0 / static_cast<double>(std::max(h, w))));
  const auto rgb = to_rgb_on_white(wrong.inputs);  // (N, h, w, 3) uint8
  const int64_t columns = std::min<int64_t>(n, 6), rows = (n + columns - 1) / columns;
  const int64_t header = 34, band = 32, pad = 12;  // title; two label lines per cell; gaps
  const int64_t cell_w = std::max<int64_t>(w * scale, 124) + pad, cell_h = band + h * scale + pad;
  const int64_t width = columns * cell_w + pad, height = header + rows * cell_h;
  std::ostringstream labels, images;
  const int64_t image_bytes = h * w * 3;
  const double half =
      static_cast<double>(scale - 1) / 2;  // from an image pixel's corner to its centre
  for (int64_t i = 0; i < n; ++i) {
    const int64_t x0 = pad + (i % columns) * cell_w, y0 = header + (i / columns) * cell_h;
    const int64_t image_x = x0 + (cell_w - pad - w * scale) / 2;
    const double centre = static_cast<double>(x0) + static_cast<double>(cell_w - pad) / 2;
    labels << "set label "
           << gnuplot_quote("true: " + class_name(class_names, wrong.labels[i].item<int64_t>()))
           << " at " << centre << "," << y0 + 10 << " center front tc rgb '#222222'\n"
           << "set label "
           << gnuplot_quote("pred: " + class_name(class_names, wrong.predicted[i].item<int64_t>()))
           << " at " << centre << "," << y0 + 25 << " center front tc rgb '#c00000'\n";
    images << (i == 0 ? "plot " : ", \\\n     ") << gnuplot_quote("plots/misclassified.rgb")
           << " binary array=(" << w << "," << h << ") skip=" << i * image_bytes << " dx=" << scale
           << " dy=" << scale << " origin=(" << static_cast<double>(image_x) + half << ","
           << static_cast<double>(y0 + band) + half
           << ") format='%uchar%uchar%uchar' with rgbimage";
  }
  {
    std::ofstream out(dir + "/misclassified.rgb", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(rgb.data_ptr<uint8_t>()),
              static_cast<std::streamsize>(rgb.numel()));
    if (!out) throw Error("could not write " + dir + "/misclassified.rgb");
  }
  std::ostringstream s;
  s << script_head("misclassified.png", static_cast<int>(width), static_cast<int>(height), 9);
  // One screen pixel per axis unit: no margins, axes spanning the canvas, y growing downwards.
  s << "set lmargin at screen 0\nset rmargin at screen 1\nset tmargin at screen 1\nset bmargin at "
       "screen 0\n"
    << "unset border\nunset tics\nunset key\nunset colorbox\n"
    << "set xrange [-0.5:" << width - 0.5 << "]\nset yrange [" << height - 0.5 << ":-0.5]\n"
    << "set label "
    << gnuplot_quote("Misclassified test images: first " + std::to_string(n) + " of " +
                     std::to_string(wrong.total))
    << " at " << width / 2 << ",17 center front font 'sans,12'\n"
    << labels.str() << images.str() << "\n";
  write_text(dir + "/misclassified.gp", s.str());
  return {"plots/misclassified.gp", "misclassified.png"};
}

}  // namespace spritetorch::runs
