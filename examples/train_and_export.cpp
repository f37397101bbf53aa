// Uses the installed spritetorch library, not the CLI: trains seed 003's SimpleNN on the built-in
// dummy data, evaluates it, reloads the checkpoint and writes its weights for Python.
//   train_and_export OUT.safetensors
// Exits 0 when the test accuracy is above 80% and the reloaded model gives the same logits.
#include <spritetorch/spritetorch.h>

#include <filesystem>
#include <iostream>

int main(int argc, char** argv) {
  namespace st = spritetorch;
  if (argc != 2) {
    std::cerr << "usage: " << argv[0] << " OUT.safetensors\n";
    return 2;
  }
  const std::string out = argv[1];
  const std::string checkpoint_path = out + ".ckpt";
  try {
    st::train::TrainConfig config;
    config.model = "simplenn";
    config.dataset = "dummy";
    config.device = "cpu";
    config.epochs = 3;
    config.optimizer = "sgd";
    config.lr = 0.05;
    config.save = checkpoint_path;
    config.overwrite = true;
    const st::train::TrainReport report = st::run_training(config);  // no observer: silent
    std::cout << "SimpleNN on " << report.device << ": test accuracy " << report.test.accuracy
              << "\n";

    const st::train::Checkpoint checkpoint = st::train::load_checkpoint(checkpoint_path);
    auto model = st::train::model_from_checkpoint(checkpoint, checkpoint_path, torch::kCPU);
    st::interop::write_safetensors(out,
                                   st::interop::python_state_dict(checkpoint, checkpoint_path));
    // The file holds what the model holds: read it back and compare one forward pass.
    const auto reread = st::interop::read_safetensors(out);
    const auto x = torch::randn({4, 3});  // (B, F) features
    model->eval();
    torch::NoGradGuard no_grad;
    auto y = model->forward(x);
    const auto& w1 = *reread.find("fc1.weight");
    const auto& b1 = *reread.find("fc1.bias");
    const auto& w2 = *reread.find("fc2.weight");
    const auto& b2 = *reread.find("fc2.bias");
    auto by_hand = torch::linear(torch::relu(torch::linear(x, w1, b1)), w2, b2);
    std::filesystem::remove(checkpoint_path);
    std::cout << "wrote " << out << " (" << reread.tensors.size() << " tensors); max |diff| "
              << (y - by_hand).abs().max().item<float>() << "\n";
    return report.test.accuracy > 0.8 && torch::allclose(y, by_hand) ? 0 : 1;
  } catch (const st::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
}
