#include "models/classifier.h"
#include "models/conv3x3.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace spritetorch::models {
namespace {

TEST(Models, OutputShapesForEachModel) {
  auto ann = make_model({"ann", {1, 28, 28}, 10});
  EXPECT_EQ(ann->forward(torch::rand({5, 1, 28, 28})).sizes(), (std::vector<int64_t>{5, 10}));
  auto cnn = make_model({"cnn", {1, 28, 28}, 10});
  EXPECT_EQ(cnn->forward(torch::rand({3, 1, 28, 28})).sizes(), (std::vector<int64_t>{3, 10}));
  auto rgba = make_model({"cnn", {4, 16, 16}, 5});
  EXPECT_EQ(rgba->forward(torch::rand({2, 4, 16, 16})).sizes(), (std::vector<int64_t>{2, 5}));
  auto simple = make_model({"simplenn", {3}, 2});
  EXPECT_EQ(simple->forward(torch::rand({7, 3})).sizes(), (std::vector<int64_t>{7, 2}));
}

// features() is what each model's last layer sees (fastcnn: its map averaged over positions), so
// the logits are that layer applied to the features.
TEST(Models, FeaturesAreWhatTheLastLayerSees) {
  torch::manual_seed(4);
  torch::NoGradGuard no_grad;
  const auto grey = torch::rand({3, 1, 28, 28}), rgba = torch::rand({3, 4, 32, 32});
  auto ann = std::dynamic_pointer_cast<AnnImpl>(make_model({"ann", {1, 28, 28}, 10}));
  EXPECT_EQ(ann->features(grey).sizes(), (std::vector<int64_t>{3, 64}));
  EXPECT_TRUE(torch::allclose(ann->out(ann->features(grey)), ann->forward(grey)));
  auto cnn = std::dynamic_pointer_cast<CnnImpl>(make_model({"cnn", {4, 32, 32}, 13}));
  cnn->eval();  // dropout off
  EXPECT_EQ(cnn->features(rgba).sizes(), (std::vector<int64_t>{3, 128}));
  EXPECT_TRUE(torch::allclose(cnn->fc2(cnn->features(rgba)), cnn->forward(rgba)));
  EXPECT_GE(cnn->features(rgba).min().item<float>(), 0.0f);  // after the ReLU
  auto simple = std::dynamic_pointer_cast<SimpleNnImpl>(make_model({"simplenn", {3}, 2}));
  const auto points = torch::rand({5, 3});
  EXPECT_TRUE(torch::allclose(simple->fc2(simple->features(points)), simple->forward(points)));
  auto fast = std::dynamic_pointer_cast<FastCnnImpl>(make_model({"fastcnn-2x", {4, 32, 32}, 13}));
  fast->eval();
  EXPECT_EQ(fast->features(rgba).sizes(), (std::vector<int64_t>{3, 128}));  // 128 channels
  // The last stage's map by hand: features average it, forward's fc reads all of it. (The
  // convolutions as the model runs them: conv3x3 takes the AVX2 kernels where they apply.)
  auto stage = [](auto& conv, auto& bn, const torch::Tensor& x) {
    return torch::max_pool2d(torch::relu(bn(conv3x3(*conv, x))), 2);
  };
  const auto map = stage(fast->conv3, fast->bn3,
                         stage(fast->conv2, fast->bn2, stage(fast->conv1, fast->bn1, rgba)));
  ASSERT_EQ(map.sizes(), (std::vector<int64_t>{3, 128, 4, 4}));
  EXPECT_TRUE(torch::allclose(fast->features(rgba), map.mean({2, 3})));
  EXPECT_TRUE(torch::allclose(fast->fc(map.flatten(1)), fast->forward(rgba)));
}

TEST(Models, SeedNetworkHasTheSeedsLayersAndNames) {
  auto ann = make_model({"ann", {1, 28, 28}, 10});
  int64_t count = 0;
  std::vector<std::string> names;
  for (const auto& p : ann->named_parameters()) {
    count += p.value().numel();
    names.push_back(p.key());
  }
  EXPECT_EQ(count, 784 * 128 + 128 + 128 * 64 + 64 + 64 * 10 + 10);
  EXPECT_EQ(names, (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                                             "out.weight", "out.bias"}));
  EXPECT_EQ(ann->relu_mlp_layers().size(), 3u);
  EXPECT_TRUE(make_model({"cnn", {1, 28, 28}, 10})->relu_mlp_layers().empty());
}

TEST(Models, CloneIsADeepCopyWithTheSameOutputsAndMode) {
  for (const auto& name : {"ann", "cnn", "simplenn"}) {
    const std::vector<int64_t> shape =
        std::string(name) == "simplenn" ? std::vector<int64_t>{3} : std::vector<int64_t>{1, 16, 16};
    torch::manual_seed(3);
    auto model = make_model({name, shape, 4});
    model->eval();  // dropout off, so the outputs can be compared
    auto copy = std::dynamic_pointer_cast<ClassifierImpl>(model->clone());
    ASSERT_TRUE(copy) << name;
    EXPECT_FALSE(copy->is_training()) << name;
    EXPECT_EQ(copy->spec().name, name);
    std::vector<int64_t> batch_shape = {5};
    batch_shape.insert(batch_shape.end(), shape.begin(), shape.end());
    const auto x = torch::rand(batch_shape);
    EXPECT_TRUE(torch::equal(model->forward(x), copy->forward(x))) << name;
    // Own storage: changing the copy leaves the original alone.
    const auto before = model->parameters()[0].clone();
    {
      torch::NoGradGuard no_grad;
      copy->parameters()[0].add_(1.0);
    }
    EXPECT_TRUE(torch::equal(model->parameters()[0], before)) << name;
    EXPECT_EQ(copy->named_parameters().keys(), model->named_parameters().keys()) << name;
  }
  auto train_mode = make_model({"ann", {1, 16, 16}, 4});
  EXPECT_TRUE(std::dynamic_pointer_cast<ClassifierImpl>(train_mode->clone())->is_training());
}

TEST(Models, CnnPoolsBeforeItsReluWithTheTextbookOrdersOutputsAndGradients) {
  // The CNN applies ReLU after max-pooling (a quarter of the values); PyTorch tutorials, and our
  // Python twin in docs/interop.md, pool after ReLU. Both orders must agree exactly, gradients too,
  // also where windows hold ties and all-negative values (rounded inputs make both likely).
  torch::manual_seed(4);
  auto model = make_model({"cnn", {1, 8, 8}, 3});
  model->eval();  // no dropout
  auto* cnn = dynamic_cast<CnnImpl*>(model.get());
  ASSERT_NE(cnn, nullptr);
  const auto x = (torch::randn({5, 1, 8, 8}) * 4).round() / 4;
  // The second convolution as the model runs it (conv3x3: the AVX2 kernels where they apply):
  // what is compared is the order of ReLU and pool.
  auto textbook = [&](const torch::Tensor& in) {
    auto h = torch::max_pool2d(torch::relu(cnn->conv1(in)), 2);
    h = torch::max_pool2d(torch::relu(conv3x3(*cnn->conv2, h)), 2);
    return cnn->fc2(torch::relu(cnn->fc1(h.flatten(1))));
  };
  auto gradients = [&](const torch::Tensor& out) {
    model->zero_grad();
    out.pow(2).sum().backward();
    std::vector<torch::Tensor> grads;
    for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
    return grads;
  };
  const auto ours = model->forward(x), theirs = textbook(x);
  EXPECT_TRUE(torch::equal(ours, theirs));
  const auto a = gradients(model->forward(x)), b = gradients(textbook(x));
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << i;
}

TEST(Models, BadRequestsAreClearErrors) {
  EXPECT_THROW(make_model({"resnet", {1, 28, 28}, 10}), Error);
  EXPECT_THROW(make_model({"cnn", {3}, 2}), Error);
  EXPECT_THROW(make_model({"ann", {1, 28, 28}, 1}), Error);
}

}  // namespace
}  // namespace spritetorch::models
