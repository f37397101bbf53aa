#include "interop/python_state.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "interop/torch_file.h"
#include "test_util.h"
#include "train/model_state.h"
#include "train/trainer.h"

namespace spritetorch::interop {
namespace {

using spritetorch::testing::ScratchDir;

train::Checkpoint fresh_checkpoint(const models::ModelSpec& spec, uint64_t seed) {
  torch::manual_seed(seed);
  auto model = models::make_model(spec);
  train::Checkpoint c;
  c.meta = {{"model", spec.name},
            {"input_shape", spec.input_shape},
            {"classes", spec.classes},
            {"dataset", "dummy"},
            {"epoch", 1},
            {"run", {{"step", 3}}}};
  c.model = train::model_state(*model);
  return c;
}

std::vector<std::string> names(const TensorFile& file) {
  std::vector<std::string> out;
  for (const auto& [name, t] : file.tensors) out.push_back(name);
  return out;
}

std::string import_error(const TensorFile& state, const models::ModelSpec& spec) {
  try {
    checkpoint_from_python(state, spec, nlohmann::json::object(), "py.safetensors");
  } catch (const DataError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(PythonState, ExportUsesPythonNamesOrderAndShapes) {
  const auto ann = python_state_dict(fresh_checkpoint({"ann", {1, 28, 28}, 10}, 1), "c.pt");
  EXPECT_EQ(names(ann), (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight",
                                                  "fc2.bias", "out.weight", "out.bias"}));
  EXPECT_EQ(ann.tensors[0].second.sizes(),
            (std::vector<int64_t>{128, 784}));  // (out, in), as nn.Linear
  EXPECT_EQ(ann.tensors[5].second.sizes(), (std::vector<int64_t>{10}));
  const auto meta = nlohmann::json::parse(ann.metadata.at("spritetorch"));
  EXPECT_EQ(meta.at("model"), "ann");
  EXPECT_FALSE(meta.contains("run"));  // mid-run state is not part of the weights
  EXPECT_EQ(ann.metadata.at("format"), "pt");

  const auto cnn = python_state_dict(fresh_checkpoint({"cnn", {4, 16, 16}, 4}, 1), "c.pt");
  EXPECT_EQ(names(cnn),
            (std::vector<std::string>{"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
                                      "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}));
  EXPECT_EQ(cnn.tensors[0].second.sizes(), (std::vector<int64_t>{32, 4, 3, 3}));
  EXPECT_EQ(cnn.tensors[4].second.sizes(), (std::vector<int64_t>{128, 64 * 4 * 4}));
  const auto simple = python_state_dict(fresh_checkpoint({"simplenn", {3}, 2}, 1), "c.pt");
  EXPECT_EQ(names(simple),
            (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}));
}

TEST(PythonState, ExportThenImportGivesTheSameLogits) {
  const models::ModelSpec spec{"cnn", {1, 28, 28}, 10};
  const auto original = fresh_checkpoint(spec, 5);
  const auto state = python_state_dict(original, "c.pt");
  const auto imported =
      checkpoint_from_python(read_safetensors_bytes(safetensors_bytes(state), "mem"), spec,
                             {{"dataset", "fashion-mnist"}}, "mem");
  EXPECT_EQ(imported.meta.at("model"), "cnn");
  EXPECT_EQ(imported.meta.at("input_shape").get<std::vector<int64_t>>(),
            (std::vector<int64_t>{1, 28, 28}));
  auto a = train::model_from_checkpoint(original, "a", torch::kCPU);
  auto b = train::model_from_checkpoint(imported, "b", torch::kCPU);
  a->eval();
  b->eval();
  const auto x = torch::rand({5, 1, 28, 28});
  EXPECT_TRUE(torch::equal(a->forward(x), b->forward(x)));
}

// BatchNorm's num_batches_tracked is an integer buffer: PyTorch and our export write it as I64, and
// import takes it back (it asked for F32 and refused every fastcnn export).
TEST(PythonState, ExportThenImportKeepsTheIntegerBuffersOfFastCnn) {
  const models::ModelSpec spec{"fastcnn", {1, 28, 28}, 10};
  auto original = fresh_checkpoint(spec, 5);
  original.model.at("bn1.num_batches_tracked").fill_(7);
  const auto state = python_state_dict(original, "c.pt");
  // In Python's state_dict order: each BatchNorm's buffers after its weight and bias.
  const auto n = names(state);
  EXPECT_EQ(
      std::vector<std::string>(n.begin(), n.begin() + 7),
      (std::vector<std::string>{"conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean",
                                "bn1.running_var", "bn1.num_batches_tracked", "conv2.weight"}));
  const auto bytes = safetensors_bytes(state);
  const auto file = read_safetensors_bytes(bytes, "mem");
  EXPECT_EQ(file.find("bn1.num_batches_tracked")->scalar_type(), torch::kInt64);
  const auto imported = checkpoint_from_python(file, spec, {{"dataset", "fashion-mnist"}}, "mem");
  EXPECT_EQ(imported.model.at("bn1.num_batches_tracked").scalar_type(), torch::kInt64);
  EXPECT_EQ(imported.model.at("bn1.num_batches_tracked").item<int64_t>(), 7);
  auto a = train::model_from_checkpoint(original, "a", torch::kCPU);
  auto b = train::model_from_checkpoint(imported, "b", torch::kCPU);
  a->eval();
  b->eval();
  const auto x = torch::rand({5, 1, 28, 28});
  EXPECT_TRUE(torch::equal(a->forward(x), b->forward(x)));
  // Any integer dtype is taken for it (Python code may save int32); a float one is not.
  TensorFile as_int32 = file;
  for (auto& [name, t] : as_int32.tensors)
    if (name == "bn2.num_batches_tracked") t = t.to(torch::kInt32);
  EXPECT_EQ(import_error(as_int32, spec), "(no error)");
  TensorFile as_float = file;
  for (auto& [name, t] : as_float.tensors)
    if (name == "bn2.num_batches_tracked") t = t.to(torch::kFloat32);
  EXPECT_EQ(import_error(as_float, spec),
            "py.safetensors: expected tensor 'bn2.num_batches_tracked' of shape [] of an integer "
            "dtype, found F32");
}

TEST(PythonState, ImportNamesTheOffendingKey) {
  const models::ModelSpec spec{"simplenn", {3}, 2};
  const auto good = python_state_dict(fresh_checkpoint(spec, 1), "c.pt");
  EXPECT_EQ(import_error(good, spec), "(no error)");

  TensorFile missing = good;
  missing.tensors.erase(missing.tensors.begin() + 1);
  EXPECT_NE(import_error(missing, spec).find("'fc1.bias' of shape [10] F32"), std::string::npos);
  EXPECT_NE(import_error(missing, spec).find("no such key"), std::string::npos);

  TensorFile extra = good;
  extra.tensors.emplace_back("fc3.weight", torch::zeros({2, 2}));
  EXPECT_NE(import_error(extra, spec).find("extra tensor 'fc3.weight'"), std::string::npos);

  TensorFile shape = good;
  shape.tensors[0].second = torch::zeros({10, 4});
  EXPECT_NE(import_error(shape, spec).find("shape [10, 4]"), std::string::npos);

  TensorFile dtype = good;
  dtype.tensors[2].second = dtype.tensors[2].second.to(torch::kFloat64);
  EXPECT_NE(import_error(dtype, spec).find("'fc2.weight' of shape [2, 10] F32, found F64"),
            std::string::npos);

  TensorFile nan = good;
  nan.tensors[3].second = torch::full({2}, NAN);
  EXPECT_NE(import_error(nan, spec).find("'fc2.bias'"), std::string::npos);

  for (const auto& message : {import_error(missing, spec), import_error(extra, spec)})
    EXPECT_EQ(message.rfind("py.safetensors: expected", 0), 0u) << message;
}

TEST(PythonState, GeneratorCheckpointsAreNotExported) {
  train::Checkpoint c;
  c.meta = {{"task", "generate"}, {"model", "unet"}};
  EXPECT_THROW(python_state_dict(c, "gen.pt"), DataError);
}

TEST(PythonState, TorchFileHoldsTheDictInOrder) {
  ScratchDir dir;
  const auto state = python_state_dict(fresh_checkpoint({"ann", {1, 28, 28}, 10}, 3), "c.pt");
  write_torch_state_dict(dir.file("w.pt"), state);
  std::ifstream in(dir.file("w.pt"), std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 4u);
  EXPECT_EQ(std::string(bytes.data(), 2), "PK");  // torch.save's zip container
  const auto dict = torch::pickle_load(bytes).toGenericDict();
  ASSERT_EQ(dict.size(), state.tensors.size());
  size_t i = 0;
  for (const auto& item : dict) {
    EXPECT_EQ(item.key().toStringRef(), state.tensors[i].first);
    EXPECT_TRUE(torch::equal(item.value().toTensor(), state.tensors[i].second));
    ++i;
  }
}

}  // namespace
}  // namespace spritetorch::interop
