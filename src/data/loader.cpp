#include "data/loader.h"

#include <algorithm>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

#include "common/avx512_diagnostics.h"
#include "common/error.h"
#include "common/small_gemm.h"
#include "data/distributed_sampler.h"

namespace spritetorch::data {

torch::Tensor epoch_order(int64_t n, uint64_t seed, int64_t epoch, bool shuffle) {
  if (!shuffle) return torch::arange(n, torch::kInt64);
  // One generator per epoch, seeded from both numbers, so epoch k's order does not depend on how
  // many random numbers earlier epochs drew (this is what makes a resumed run see the same data).
  const uint64_t mixed = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch) + 1;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(mixed);
  return torch::randperm(n, gen, torch::TensorOptions().dtype(torch::kInt64));
}

const Choices<ClassSampling>& choices_of(ClassSampling) {
  static const Choices<ClassSampling> kChoices{
      {{ClassSampling::kNatural, "natural"}, {ClassSampling::kBalanced, "balanced"}}};
  return kChoices;
}

torch::Tensor balanced_epoch_order(const torch::Tensor& labels, uint64_t seed, int64_t epoch) {
  const auto host = labels.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t n = host.numel();
  const int64_t* label = host.data_ptr<int64_t>();
  std::vector<std::vector<int64_t>> rows;  // rows[c]: the rows of class c
  for (int64_t i = 0; i < n; ++i) {
    if (label[i] < 0) throw Error("class sampling: negative label " + std::to_string(label[i]));
    if (static_cast<size_t>(label[i]) >= rows.size()) rows.resize(label[i] + 1);
    rows[label[i]].push_back(i);
  }
  std::vector<const std::vector<int64_t>*> present;
  for (const auto& r : rows)
    if (!r.empty()) present.push_back(&r);
  if (present.empty()) return torch::empty({0}, torch::kInt64);
  // Its own stream (not epoch_order's), seeded by (seed, epoch) alone as epoch_order is.
  const uint64_t mixed =
      (seed ^ 0xB5AD4ECEDA1CE2A9ull) * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch) + 1;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(mixed);
  const int64_t classes = static_cast<int64_t>(present.size());
  // N / C draws per class; the remainder's extra draws go to classes picked at random.
  const auto extra = torch::randperm(classes, gen, torch::kInt64);
  std::vector<int64_t> quota(classes, n / classes);
  for (int64_t k = 0; k < n % classes; ++k) ++quota[extra[k].item<int64_t>()];
  std::vector<int64_t> order;
  order.reserve(n);
  for (int64_t c = 0; c < classes; ++c) {
    const auto& r = *present[c];
    const int64_t m = static_cast<int64_t>(r.size());
    for (int64_t taken = 0; taken < quota[c]; taken += m) {  // one fresh permutation per cycle
      const auto perm = torch::randperm(m, gen, torch::kInt64);
      const int64_t* p = perm.data_ptr<int64_t>();
      for (int64_t j = 0; j < std::min(m, quota[c] - taken); ++j) order.push_back(r[p[j]]);
    }
  }
  const auto mix = torch::randperm(n, gen, torch::kInt64);  // interleave the classes
  auto out = torch::empty({n}, torch::kInt64);
  const int64_t* q = mix.data_ptr<int64_t>();
  int64_t* o = out.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) o[i] = order[q[i]];
  return out;
}

torch::Tensor training_order(const LoaderOptions& options, const torch::Tensor& labels,
                             int64_t epoch) {
  if (!options.shuffle) return torch::Tensor();
  if (options.class_sampling == ClassSampling::kBalanced)
    return balanced_epoch_order(labels, options.seed, epoch);
  return epoch_order(labels.size(0), options.seed, epoch, true);
}

int64_t count_batches(int64_t samples, int64_t batch_size, bool drop_last) {
  // Not (samples + batch_size - 1) / batch_size: that overflows for --batch-size near 2^63.
  return samples / batch_size + (!drop_last && samples % batch_size != 0 ? 1 : 0);
}

ResidentLoader::ResidentLoader(const Dataset& dataset, torch::Device device, LoaderOptions options)
    : device_(device), options_(options) {
  if (options_.batch_size <= 0)
    throw Error("batch size must be positive, got " + std::to_string(options_.batch_size));
  if (dataset.size() == 0) throw Error("dataset '" + dataset.name + "' is empty");
  inputs_ = dataset.inputs.to(device_).contiguous();
  labels_ = dataset.labels.to(device_, torch::kInt64).contiguous();
  if (options_.class_sampling == ClassSampling::kBalanced)
    host_labels_ = dataset.labels.to(torch::kCPU, torch::kInt64).contiguous();
}

int64_t ResidentLoader::batches_per_epoch() const {
  return count_batches(epoch_size(), options_.batch_size, options_.drop_last);
}

int64_t ResidentLoader::epoch_size() const {
  const int64_t n = inputs_.size(0);
  return options_.shard_count > 1 ? shard_size(n, options_.shard_count, options_.drop_last) : n;
}

int64_t ResidentLoader::samples_per_epoch() const {
  const int64_t n = epoch_size();
  return options_.drop_last ? n / options_.batch_size * options_.batch_size : n;
}

void ResidentLoader::start_epoch(int64_t epoch) {
  cursor_ = 0;
  order_ = training_order(options_, host_labels_.defined() ? host_labels_ : labels_, epoch);
  if (order_.defined()) order_ = order_.to(device_);
  if (options_.shard_count > 1) {
    const auto full =
        order_.defined() ? order_ : torch::arange(inputs_.size(0), torch::kInt64).to(device_);
    order_ = shard_order(full, options_.shard_rank, options_.shard_count, options_.drop_last);
  }
  if (order_.defined()) order_ = order_.contiguous();  // read through data_ptr on the CPU
  if (order_.defined() && inputs_.is_cpu() && inputs_.scalar_type() == torch::kUInt8) {
    // The first batch's rows (next() prefetches each following batch's).
    prefetch_rows(order_.data_ptr<int64_t>(), 0, std::min(options_.batch_size, order_.size(0)));
  }
}

namespace {
// Whether the caller's last batch tensor can take the next batch: the shape and type it needs, and
// nobody but the caller's Batch holding it or a view of its memory (a batch the caller kept, a
// view, an autograd graph's saved input would each hold a reference, and then a new tensor is
// made). Saves a 200 KB allocation and free a step (the free consolidated glibc's fast bins, a
// few us each time) and keeps the step's input at one address.
bool reusable(const torch::Tensor& t, at::IntArrayRef shape, torch::ScalarType type) {
  return t.defined() && t.is_cpu() && t.scalar_type() == type && t.sizes() == shape &&
         t.is_contiguous() && t.storage_offset() == 0 && t.use_count() == 1 &&
         t.storage().use_count() == 1 && !t.requires_grad();
}
}  // namespace

namespace {
// out[j] = in[j] * (1 / 255) for j < n: the same arithmetic as to_model_input (the int-to-float
// conversion of 0..255 is exact, the product rounds once), so every form gives the same floats.
void unit_floats_loop(const uint8_t* in, float* out, int64_t n, float scale) {
  for (int64_t j = 0; j < n; ++j) out[j] = static_cast<float>(in[j]) * scale;
}
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SPRITETORCH_CONVERT_SIMD 1
SPRITETORCH_AVX512_DIAGNOSTICS_BEGIN
// 16 bytes to 16 floats in three instructions. The compiler's own vectorisation of the loop (the
// baseline x86-64's SSE2) takes a dozen per 16, and with a copy per step thread each thread
// converts the whole batch.
__attribute__((target("avx512f"))) void unit_floats_avx512(const uint8_t* in, float* out, int64_t n,
                                                           float scale) {
  const __m512 s = _mm512_set1_ps(scale);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + j));
    _mm512_storeu_ps(out + j, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes)), s));
  }
  unit_floats_loop(in + j, out + j, n - j, scale);
}
SPRITETORCH_AVX512_DIAGNOSTICS_END
__attribute__((target("avx2"))) void unit_floats_avx2(const uint8_t* in, float* out, int64_t n,
                                                      float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(in + j));
    _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)), s));
  }
  unit_floats_loop(in + j, out + j, n - j, scale);
}
#endif

using UnitFloats = void (*)(const uint8_t*, float*, int64_t, float);
UnitFloats best_unit_floats() {
#ifdef SPRITETORCH_CONVERT_SIMD
  if (gemm::available(gemm::Kernel::avx512)) return unit_floats_avx512;
  if (gemm::available(gemm::Kernel::avx2)) return unit_floats_avx2;
#endif
  return unit_floats_loop;
}
}  // namespace

void uint8_to_unit_floats(const uint8_t* in, float* out, int64_t n) {
  static const UnitFloats convert = best_unit_floats();
  convert(in, out, n, 1.0f / 255.0f);
}

void ResidentLoader::gather_cpu_uint8(const int64_t* rows, int64_t start, int64_t b,
                                      const int64_t* next_rows, int64_t next_count, Batch& batch) {
  auto shape = inputs_.sizes().vec();
  shape[0] = b;
  const int parts = pool_ ? pool_->size() : 1;
  // Copies only while every shard has its own thread: with fewer (the thread governor), one
  // thread would convert the batch twice for nothing.
  const int copies = copy_per_thread_ && parts > 1 && pool_->threads() == parts ? parts : 1;
  // The caller's last batch tensors, moved out of `batch`, so that only `out` can hold them
  // (copy 0 is `inputs` itself, or whatever replaced it).
  std::vector<torch::Tensor> out = std::move(batch.thread_inputs);
  batch.thread_inputs.clear();
  out.resize(copies);
  out[0] = std::move(batch.inputs);
  for (auto& copy : out)
    if (!reusable(copy, shape, torch::kFloat32)) copy = torch::empty(shape, torch::kFloat32);
  const int64_t row = inputs_.numel() / inputs_.size(0);
  const uint8_t* from = inputs_.data_ptr<uint8_t>();
  auto convert = [&](int copy, int64_t begin, int64_t end) {
    float* to = out[copy].data_ptr<float>();
    for (int64_t i = begin; i < end; ++i)
      uint8_to_unit_floats(from + (rows ? rows[i] : start + i) * row, to + i * row, row);
  };
  if (copies > 1) {  // every thread the whole batch, into its own copy; and all the next rows
    pool_->run([&](int t) {
      convert(t, 0, b);
      prefetch_rows(next_rows, 0, next_count);
    });
  } else if (parts > 1 && b >= parts) {  // rows split over the threads (seed batch: ~25 -> ~15 us)
    pool_->run([&](int t) {
      convert(0, b * t / parts, b * (t + 1) / parts);
      prefetch_rows(next_rows, next_count * t / parts, next_count * (t + 1) / parts);
    });
  } else {
    convert(0, 0, b);
    prefetch_rows(next_rows, 0, next_count);
  }
  batch.inputs = out[0];
  if (copies > 1) batch.thread_inputs = std::move(out);
}

void ResidentLoader::prefetch_rows(const int64_t* rows, int64_t begin, int64_t end) const {
  // A batch's rows are scattered over the whole dataset (47 MB for Fashion-MNIST): asking for
  // them early lets the memory system fetch them while the step computes.
  const int64_t row = inputs_.numel() / inputs_.size(0);
  const auto* from = inputs_.data_ptr<uint8_t>();
  for (int64_t i = begin; i < end; ++i)
    for (int64_t j = 0; j < row; j += 64) __builtin_prefetch(from + rows[i] * row + j);
}

torch::Tensor ResidentLoader::gather_cpu_labels(const int64_t* rows, int64_t b,
                                                torch::Tensor reuse) const {
  // labels_.index_select, without its microseconds of dispatch.
  const int64_t shape[] = {b};
  auto out =
      reusable(reuse, shape, torch::kInt64) ? std::move(reuse) : torch::empty(shape, torch::kInt64);
  const int64_t* from = labels_.data_ptr<int64_t>();
  int64_t* to = out.data_ptr<int64_t>();
  for (int64_t i = 0; i < b; ++i) to[i] = from[rows[i]];
  return out;
}

bool ResidentLoader::next(Batch& batch) {
  const int64_t n = epoch_size();
  const int64_t remaining = n - cursor_;
  if (remaining <= 0 || (options_.drop_last && remaining < options_.batch_size)) return false;
  const int64_t b = std::min(options_.batch_size, remaining);
  if (inputs_.is_cpu() && inputs_.scalar_type() == torch::kUInt8) {
    // The CPU's uint8 images: gathered and converted in one pass (no uint8 intermediate), and the
    // next batch's rows prefetched while the step computes. Same values as the general path below.
    // Raw pointers: a tensor op here costs about as much as converting a row.
    const int64_t* rows = order_.defined() ? order_.data_ptr<int64_t>() + cursor_ : nullptr;
    const int64_t next_count = rows ? std::min(options_.batch_size, n - cursor_ - b) : 0;
    gather_cpu_uint8(rows, cursor_, b, rows ? rows + b : nullptr, next_count, batch);
    batch.labels =
        rows ? gather_cpu_labels(rows, b, std::move(batch.labels)) : labels_.narrow(0, cursor_, b);
  } else if (order_.defined()) {
    batch.thread_inputs.clear();
    const auto index = order_.narrow(0, cursor_, b);
    batch.inputs = to_model_input(inputs_.index_select(0, index));
    batch.labels = labels_.index_select(0, index);
  } else {
    batch.thread_inputs.clear();
    batch.inputs = to_model_input(inputs_.narrow(0, cursor_, b));
    batch.labels = labels_.narrow(0, cursor_, b);
  }
  cursor_ += b;
  return true;
}

}  // namespace spritetorch::data
