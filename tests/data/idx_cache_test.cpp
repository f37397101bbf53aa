#include "data/idx_cache.h"

#include <sys/stat.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <optional>

#include "common/error.h"
#include "data/fashion_mnist.h"
#include "data/idx_reader.h"
#include "test_util.h"
#include "train/trainer.h"

namespace spritetorch::data {
namespace {

namespace fs = std::filesystem;
using spritetorch::testing::idx_bytes;
using spritetorch::testing::ScratchDir;
using spritetorch::testing::write_bytes;
using spritetorch::testing::write_gz;

std::vector<uint8_t> values(size_t n, int step) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * step + 3);
  return v;
}

// A cache in dir/cache whose notes are collected.
struct Recorded {
  explicit Recorded(const ScratchDir& dir) {
    cache.dir = dir.file("cache");
    cache.note = [this](const std::string& line) { notes.push_back(line); };
  }
  IdxCache cache;
  std::vector<std::string> notes;
};

// Sets (or unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(IdxCache, HitGivesTheUncachedTensorAndIsServedFromTheCache) {
  ScratchDir dir;
  Recorded r(dir);
  const std::string src = dir.file("images.gz");
  write_gz(src, idx_bytes({4, 3, 5}, values(60, 7)));
  const auto uncached = read_idx(src);

  const auto first = read_idx_cached(src, r.cache);  // decodes and stores
  ASSERT_TRUE(fs::exists(idx_cache_file(src, r.cache)));
  const auto second = read_idx_cached(src, r.cache);  // from the cache
  EXPECT_TRUE(torch::equal(first, uncached));
  EXPECT_TRUE(torch::equal(second, uncached));
  EXPECT_EQ(second.sizes(), uncached.sizes());
  EXPECT_EQ(second.scalar_type(), torch::kUInt8);
  EXPECT_TRUE(r.notes.empty());

  // The source spoiled in place (same size, mtime put back): the reader would now fail, the
  // cache still answers, so the reads above were hits.
  const auto mtime = fs::last_write_time(src);
  const auto size = fs::file_size(src);
  {
    std::fstream f(src, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size - 6));  // inside the gzip trailer's CRC
    f.put('\x55');
    f.put('\xaa');
  }
  fs::last_write_time(src, mtime);
  ASSERT_EQ(fs::file_size(src), size);
  EXPECT_THROW(read_idx(src), DataError);
  EXPECT_TRUE(torch::equal(read_idx_cached(src, r.cache), uncached));
  EXPECT_TRUE(r.notes.empty());
}

// A payload of several huge pages (read onto 2 MiB pages, freed with the tensor) and one that is
// not a whole number of them; a corrupt byte past the first page is still caught by the CRC-32C.
TEST(IdxCache, LargePayloadsRoundTripAndAreVerifiedWhole) {
  ScratchDir dir;
  Recorded r(dir);
  const std::string src = dir.file("large.gz");
  write_gz(src, idx_bytes({1000, 28, 28}, values(784000, 13)));  // 784,000 bytes: one page
  write_gz(dir.file("larger.gz"), idx_bytes({6000, 28, 28}, values(4704000, 5)));  // 2.2 pages
  for (const std::string& file : {src, dir.file("larger.gz")}) {
    const auto uncached = read_idx(file);
    read_idx_cached(file, r.cache);
    for (int i = 0; i < 3; ++i) {  // served from the cache, each tensor freed before the next
      const auto cached = read_idx_cached(file, r.cache);
      ASSERT_TRUE(torch::equal(cached, uncached)) << file;
    }
  }
  EXPECT_TRUE(r.notes.empty());
  const std::string cache_file = idx_cache_file(dir.file("larger.gz"), r.cache);
  {
    std::fstream f(cache_file, std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>(fs::file_size(cache_file) - 100);
    f.seekg(at);
    const char byte = static_cast<char>(f.get());
    f.seekp(at);
    f.put(static_cast<char>(byte ^ 0x5a));
  }
  const auto again = read_idx_cached(dir.file("larger.gz"), r.cache);
  EXPECT_TRUE(torch::equal(again, read_idx(dir.file("larger.gz"))));
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("checksum mismatch"), std::string::npos) << r.notes[0];
}

TEST(IdxCache, PlainFilesAreReadDirectly) {
  ScratchDir dir;
  Recorded r(dir);
  const std::string src = dir.file("plain");
  write_bytes(src, idx_bytes({6}, values(6, 1)));
  EXPECT_TRUE(torch::equal(read_idx_cached(src, r.cache), read_idx(src)));
  EXPECT_FALSE(fs::exists(idx_cache_file(src, r.cache)));
}

TEST(IdxCache, CorruptOrTruncatedFileIsIgnoredWithANoteAndReplaced) {
  ScratchDir dir;
  Recorded r(dir);
  const std::string src = dir.file("labels.gz");
  write_gz(src, idx_bytes({200}, values(200, 5)));
  const auto uncached = read_idx(src);
  read_idx_cached(src, r.cache);
  const std::string file = idx_cache_file(src, r.cache);
  const auto good_size = fs::file_size(file);

  {  // one payload byte flipped: the CRC catches it
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(good_size - 10));
    f.put('\x7f');
  }
  EXPECT_TRUE(torch::equal(read_idx_cached(src, r.cache), uncached));
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("checksum"), std::string::npos) << r.notes[0];
  EXPECT_NE(r.notes[0].find(file), std::string::npos) << r.notes[0];
  // Rewritten: the next read is a silent hit.
  EXPECT_TRUE(torch::equal(read_idx_cached(src, r.cache), uncached));
  EXPECT_EQ(r.notes.size(), 1u);

  fs::resize_file(file, good_size - 1);
  EXPECT_TRUE(torch::equal(read_idx_cached(src, r.cache), uncached));
  ASSERT_EQ(r.notes.size(), 2u);
  EXPECT_NE(r.notes[1].find("truncated"), std::string::npos) << r.notes[1];
  EXPECT_EQ(fs::file_size(file), good_size);

  fs::resize_file(file, 40);  // inside the header
  EXPECT_TRUE(torch::equal(read_idx_cached(src, r.cache), uncached));
  ASSERT_EQ(r.notes.size(), 3u);
  EXPECT_NE(r.notes[2].find("truncated"), std::string::npos) << r.notes[2];

  write_bytes(file, {'n', 'o', 't', ' ', 'a', ' ', 'c', 'a', 'c', 'h', 'e'});
  EXPECT_TRUE(torch::equal(read_idx_cached(src, r.cache), uncached));
  ASSERT_EQ(r.notes.size(), 4u);
  EXPECT_EQ(fs::file_size(file), good_size);
  EXPECT_TRUE(torch::equal(read_idx_cached(src, r.cache), uncached));
  EXPECT_EQ(r.notes.size(), 4u);
}

TEST(IdxCache, ChangedSourceMtimeOrSizeInvalidates) {
  ScratchDir dir;
  Recorded r(dir);
  const std::string src = dir.file("images.gz");
  write_gz(src, idx_bytes({2, 8}, values(16, 7)));
  const auto mtime = fs::last_write_time(src);
  read_idx_cached(src, r.cache);

  // The same bytes, a newer mtime: the mtime alone invalidates.
  fs::last_write_time(src, mtime + std::chrono::seconds(5));
  EXPECT_TRUE(torch::equal(read_idx_cached(src, r.cache), read_idx(src)));
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("stale"), std::string::npos) << r.notes[0];
  EXPECT_TRUE(torch::equal(read_idx_cached(src, r.cache), read_idx(src)));  // rewritten: a hit
  EXPECT_EQ(r.notes.size(), 1u);

  // Other size, mtime put back to what the cache holds: the size alone invalidates.
  const auto held = fs::last_write_time(src);
  const auto old_size = fs::file_size(src);
  write_gz(src, idx_bytes({3, 8}, values(24, 13)));
  fs::last_write_time(src, held);
  ASSERT_NE(fs::file_size(src), old_size);
  const auto after_size = read_idx_cached(src, r.cache);
  EXPECT_EQ(after_size.sizes(), (std::vector<int64_t>{3, 8}));
  EXPECT_TRUE(torch::equal(after_size, read_idx(src)));
  ASSERT_EQ(r.notes.size(), 2u);
  EXPECT_NE(r.notes[1].find("stale"), std::string::npos) << r.notes[1];
}

// A cache file whose source is gone (a deleted --data copy) is removed when another entry is
// written; one whose source is there, and a file that is not a cache file, stay.
TEST(IdxCache, AnEntryWhoseSourceIsGoneIsRemovedWhenAnotherIsWritten) {
  ScratchDir dir;
  Recorded r(dir);
  fs::create_directories(dir.file("a"));
  fs::create_directories(dir.file("b"));
  fs::create_directories(dir.file("c"));
  for (const char* copy : {"a", "b", "c"})
    write_gz(dir.file(std::string(copy) + "/images.gz"), idx_bytes({4, 3, 5}, values(60, 7)));
  read_idx_cached(dir.file("a/images.gz"), r.cache);
  read_idx_cached(dir.file("b/images.gz"), r.cache);
  const std::string a = idx_cache_file(dir.file("a/images.gz"), r.cache);
  const std::string b = idx_cache_file(dir.file("b/images.gz"), r.cache);
  ASSERT_TRUE(fs::exists(a) && fs::exists(b));
  std::ofstream(dir.file("cache/other.idxcache")) << "not ours";
  fs::remove_all(dir.file("a"));
  read_idx_cached(dir.file("b/images.gz"), r.cache);  // a hit writes nothing: a stays
  EXPECT_TRUE(fs::exists(a));
  read_idx_cached(dir.file("c/images.gz"), r.cache);  // a new entry
  EXPECT_FALSE(fs::exists(a));
  EXPECT_TRUE(fs::exists(b));
  EXPECT_TRUE(fs::exists(idx_cache_file(dir.file("c/images.gz"), r.cache)));
  EXPECT_TRUE(fs::exists(dir.file("cache/other.idxcache")));
  EXPECT_TRUE(r.notes.empty());
}

TEST(IdxCache, UnwritableCacheDirStillReadsWithANote) {
  ScratchDir dir;
  Recorded r(dir);
  write_bytes(dir.file("blocker"), {1});
  r.cache.dir = dir.file("blocker") + "/spritetorch";  // under a regular file: cannot be created
  const std::string src = dir.file("x.gz");
  write_gz(src, idx_bytes({5}, values(5, 1)));
  EXPECT_TRUE(torch::equal(read_idx_cached(src, r.cache), read_idx(src)));
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("cannot write"), std::string::npos) << r.notes[0];
  EXPECT_EQ(r.notes[0].find('\n'), std::string::npos);  // one line
}

// A FIFO at the cache file's name: opening it would wait for a writer for ever.
TEST(IdxCache, AFifoOrFolderAtTheCachePathIsIgnoredWithANoteAndLeftAlone) {
  ScratchDir dir;
  Recorded r(dir);
  const std::string src = dir.file("x.gz");
  write_gz(src, idx_bytes({4}, values(4, 3)));
  fs::create_directories(r.cache.dir);
  const std::string file = idx_cache_file(src, r.cache);
  ASSERT_EQ(::mkfifo(file.c_str(), 0600), 0);
  EXPECT_TRUE(torch::equal(read_idx_cached(src, r.cache), read_idx(src)));
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("not a regular file"), std::string::npos) << r.notes[0];
  EXPECT_NE(r.notes[0].find("running uncached"), std::string::npos) << r.notes[0];
  EXPECT_TRUE(fs::is_fifo(file));  // the user's, not replaced
  fs::remove(file);
  fs::create_directory(file);
  EXPECT_TRUE(torch::equal(read_idx_cached(src, r.cache), read_idx(src)));
  ASSERT_EQ(r.notes.size(), 2u);
  EXPECT_TRUE(fs::is_directory(file));
}

TEST(IdxCache, SourceErrorsAreTheReadersOwn) {
  ScratchDir dir;
  Recorded r(dir);
  const std::string src = dir.file("bad.gz");
  auto bytes = idx_bytes({2}, {1, 2});
  bytes[0] = 0x42;
  write_gz(src, bytes);
  EXPECT_THROW(read_idx_cached(src, r.cache), DataError);
  EXPECT_FALSE(fs::exists(idx_cache_file(src, r.cache)));
  EXPECT_THROW(read_idx_cached(dir.file("missing.gz"), r.cache), DataError);
}

TEST(IdxCache, FromEnvironment) {
  {
    ScopedEnv xdg("XDG_CACHE_HOME", "/some/where");
    ScopedEnv on("SPRITETORCH_CACHE", nullptr);
    EXPECT_EQ(IdxCache::from_environment().dir, "/some/where/spritetorch");
  }
  {
    ScopedEnv xdg("XDG_CACHE_HOME", "relative/ignored");
    ScopedEnv home("HOME", "/home/someone");
    EXPECT_EQ(IdxCache::from_environment().dir, "/home/someone/.cache/spritetorch");
  }
  {
    ScopedEnv xdg("XDG_CACHE_HOME", "/some/where");
    ScopedEnv off("SPRITETORCH_CACHE", "0");
    EXPECT_EQ(IdxCache::from_environment().dir, "");
  }
  {
    ScopedEnv bad("SPRITETORCH_CACHE", "maybe");
    try {
      IdxCache::from_environment();
      FAIL() << "no error for SPRITETORCH_CACHE=maybe";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("SPRITETORCH_CACHE=maybe"), std::string::npos);
    }
  }
}

TEST(IdxCache, FashionMnistThroughTheCacheEqualsTheUncachedRead) {
  ScratchDir dir;
  Recorded r(dir);
  const auto images = values(3 * 28 * 28, 3);
  write_gz(dir.file("t10k-images-idx3-ubyte.gz"), idx_bytes({3, 28, 28}, images));
  write_gz(dir.file("t10k-labels-idx1-ubyte.gz"), idx_bytes({3}, {9, 0, 4}));
  const auto plain = load_fashion_mnist(dir.path().string(), Split::kTest);
  for (int pass = 0; pass < 2; ++pass) {  // a miss, then a hit
    const auto cached = load_fashion_mnist(dir.path().string(), Split::kTest, r.cache);
    EXPECT_TRUE(torch::equal(cached.inputs, plain.inputs));
    EXPECT_TRUE(torch::equal(cached.labels, plain.labels));
  }
  EXPECT_TRUE(r.notes.empty());
}

// eval reads the test split alone: a folder of the two t10k files evaluates (load_datasets, which
// trains, needs the training files too), and its class names are Fashion-MNIST's, as training
// recorded them.
TEST(IdxCache, TestSplitAloneNeedsOnlyTheTestFiles) {
  ScratchDir dir;
  ScopedEnv off("SPRITETORCH_CACHE", "0");
  write_gz(dir.file("t10k-images-idx3-ubyte.gz"), idx_bytes({3, 28, 28}, values(3 * 28 * 28, 5)));
  write_gz(dir.file("t10k-labels-idx1-ubyte.gz"), idx_bytes({3}, {9, 0, 4}));
  train::TrainConfig config;
  config.dataset = "fashion-mnist";
  config.data_dir = dir.path().string();
  const Dataset test = train::load_test_dataset(config);
  EXPECT_EQ(test.size(), 3);
  EXPECT_TRUE(torch::equal(test.labels, torch::tensor({9, 0, 4}, torch::kLong)));
  EXPECT_EQ(test.class_names, fashion_mnist_classes());
  EXPECT_EQ(test.name, "fashion-mnist/t10k");
  config.test_limit = 2;  // the first N, as training's --test-limit
  EXPECT_TRUE(
      torch::equal(train::load_test_dataset(config).labels, torch::tensor({9, 0}, torch::kLong)));
  try {
    train::load_datasets(config);
    ADD_FAILURE() << "load_datasets read a folder without the training files";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train-images-idx3-ubyte"), std::string::npos) << e.what();
  }
}

TEST(IdxCache, RealFashionMnistThroughTheCache) {
  SKIP_WITHOUT_FASHION_MNIST();
  ScratchDir dir;
  Recorded r(dir);
  const auto plain = load_fashion_mnist(kDefaultFashionMnistDir, Split::kTrain);
  load_fashion_mnist(kDefaultFashionMnistDir, Split::kTrain, r.cache);
  const auto hit = load_fashion_mnist(kDefaultFashionMnistDir, Split::kTrain, r.cache);
  EXPECT_TRUE(torch::equal(hit.inputs, plain.inputs));
  EXPECT_TRUE(torch::equal(hit.labels, plain.labels));
  EXPECT_TRUE(r.notes.empty());
}

}  // namespace
}  // namespace spritetorch::data
