// tests/data/test_loader.cpp - data_loader: every sample once per epoch (and across ranks), the same
// batches whatever the number of workers, contiguous batch buffers, a bounded queue, worker
// exceptions delivered to the caller, resume, and a shutdown that leaves no thread behind.
#include <dirent.h>  // opendir/readdir: counting this process's threads in /proc/self/task

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>

#include "support/values.hpp"
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <thread>
#include <vector>

#include "trainkit/data/loader.hpp"

using Catch::Matchers::Contains;
using trainkit::index_t;
using trainkit::shape;
using trainkit::tensor;
namespace data = trainkit::data;
using clock_type = std::chrono::steady_clock;

namespace {

/// Threads of this process now (entries of /proc/self/task).
int thread_count() {
  DIR* d = ::opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  while (const dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++n;
  ::closedir(d);
  return n;
}

/// Waits (up to 2 s) for the thread count to come back to `expected`: a joined thread leaves
/// /proc a moment after join() returns.
int settled_thread_count(int expected) {
  const auto until = clock_type::now() + std::chrono::seconds(2);
  int n = thread_count();
  while (n != expected && clock_type::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    n = thread_count();
  }
  return n;
}

/// Sample i is [2, 3, 4] with element j = 1000 i + j, label i % 10. Counts get() calls, can fail on
/// one index and can be slow; copies share the counters (the loader holds a copy).
struct toy_dataset {
  index_t n = 0;
  index_t fail_at = -1;
  std::chrono::microseconds delay{0};
  std::shared_ptr<std::atomic<index_t>> gets = std::make_shared<std::atomic<index_t>>(0);

  index_t size() const { return n; }
  shape sample_shape() const { return {2, 3, 4}; }
  void get(index_t i, float* image, std::int64_t* label) const {
    gets->fetch_add(1);
    if (delay.count()) std::this_thread::sleep_for(delay);
    if (i == fail_at) throw std::runtime_error("corrupt sample " + std::to_string(i));
    for (index_t j = 0; j < 24; ++j) image[j] = static_cast<float>(1000 * i + j);
    *label = i % 10;
  }
};
static_assert(data::indexable_dataset<toy_dataset>);
static_assert(data::indexable_dataset<data::tensor_dataset>);
static_assert(data::index_sampler<data::distributed_sampler>);

/// The sample indices of a batch of toy_dataset samples, checking shape, contiguity and contents.
std::vector<index_t> check_batch(const data::batch<float>& b, index_t expected_size) {
  REQUIRE(b.x.sizes() == shape{expected_size, 2, 3, 4});
  REQUIRE(b.y.sizes() == shape{expected_size});
  REQUIRE(b.x.is_contiguous());
  REQUIRE(b.y.is_contiguous());
  REQUIRE(b.x.offset() == 0);
  std::vector<index_t> ids;
  const float* x = b.x.data();  // one buffer: row r at x + 24 r
  for (index_t r = 0; r < expected_size; ++r) {
    const auto i = static_cast<index_t>(x[r * 24] / 1000);
    for (index_t j = 0; j < 24; ++j) REQUIRE(x[r * 24 + j] == static_cast<float>(1000 * i + j));
    REQUIRE(b.y.data()[r] == i % 10);
    ids.push_back(i);
  }
  return ids;
}

template <class Loader>
std::vector<std::vector<index_t>> drain(Loader& loader, index_t batch_size, index_t samples) {
  std::vector<std::vector<index_t>> out;
  index_t seen = 0;
  for (auto& b : loader) {
    const index_t expect = std::min(batch_size, samples - seen);
    out.push_back(check_batch(b, expect));
    seen += expect;
  }
  return out;
}

using trainkit::test::flat;

}  // namespace

TEST_CASE("data_loader: every sample once per epoch, batches in the sampler's order", "[data][loader]") {
  const toy_dataset ds{.n = 50};
  for (index_t workers : {0, 1, 4}) {
    INFO("num_workers = " << workers);
    data::data_loader loader(ds, data::shuffled_sampler(50, 7), {.batch_size = 7, .num_workers = workers});
    REQUIRE(loader.size() == 8);  // 7 * 7 + 1
    for (std::uint64_t e = 0; e < 3; ++e) {
      loader.set_epoch(e);
      const auto batches = drain(loader, 7, 50);
      REQUIRE(batches.size() == 8);
      CHECK(batches.back().size() == 1);
      const auto order = flat(batches);
      CHECK(order == data::epoch_permutation(50, 7, e));
      CHECK(loader.position() == 8);
      CHECK_FALSE(loader.has_next());
      CHECK(loader.sampler().position() == 50);
      CHECK_THROWS_WITH(loader.next(), Contains("data_loader::next") && Contains("set_epoch"));
    }
  }
  // drop_last leaves out the short batch; sequential order.
  data::data_loader dl(ds, data::sequential_sampler(50),
                       {.batch_size = 7, .num_workers = 2, .drop_last = true});
  const auto batches = drain(dl, 7, 49);
  CHECK(batches.size() == 7);
  std::vector<index_t> first49(49);
  std::iota(first49.begin(), first49.end(), index_t(0));
  CHECK(flat(batches) == first49);
}

TEST_CASE("data_loader: across ranks every sample once (plus the sampler's padding)", "[data][loader]") {
  const toy_dataset ds{.n = 50};
  std::map<index_t, int> count;
  for (index_t rank = 0; rank < 3; ++rank) {
    data::distributed_sampler s(50, {.num_replicas = 3, .rank = rank, .seed = 11});
    s.set_epoch(1);
    data::data_loader loader(ds, s, {.batch_size = 4, .num_workers = 2});
    REQUIRE(loader.epoch() == 1);
    for (index_t i : flat(drain(loader, 4, 17))) ++count[i];
  }
  CHECK(count.size() == 50);
  int repeats = 0;
  for (const auto& [i, k] : count) repeats += k - 1;
  CHECK(repeats == 1);  // 3 * 17 = 51 slots for 50 samples
}

TEST_CASE("data_loader: the same batches with 0, 1 or 4 workers, transforms included", "[data][loader]") {
  // Images [3, 8, 8] in a tensor_dataset, augmented: random crop with padding, flip, normalize.
  const index_t n = 37;
  std::vector<float> v(static_cast<std::size_t>(n * 192));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 31) % 97);
  std::vector<std::int64_t> labels(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) labels[static_cast<std::size_t>(i)] = (i * 3) % 10;
  const data::basic_dataset<float> set{tensor<float>::from_vector(v, {n, 3, 8, 8}),
                                       tensor<std::int64_t>::from_vector(labels, {n})};
  const auto augment = data::compose(data::random_crop({.padding = 2}), data::random_horizontal_flip(),
                                     data::normalize({.mean = {40.0f}, .stddev = {20.0f}}));

  auto run = [&](index_t workers, std::uint64_t seed) {
    data::data_loader loader(
        set, data::shuffled_sampler(n, 3),
        {.batch_size = 5, .num_workers = workers, .prefetch = 3, .seed = seed, .transform = augment});
    loader.set_epoch(2);
    std::vector<float> xs;
    std::vector<std::int64_t> ys;
    for (auto& b : loader) {
      REQUIRE(b.x.sizes()[1] == 3);
      REQUIRE(b.x.is_contiguous());
      const auto x = b.x.to_vector();
      const auto y = b.y.to_vector();
      xs.insert(xs.end(), x.begin(), x.end());
      ys.insert(ys.end(), y.begin(), y.end());
    }
    return std::make_pair(xs, ys);
  };
  const auto one = run(1, 99);
  CHECK(run(4, 99) == one);
  CHECK(run(0, 99) == one);
  CHECK(run(4, 98).first != one.first);  // another seed, other augmentations (same labels)
  CHECK(run(4, 98).second == one.second);

  // Sample i of epoch 2 is augmented with sample_rng{seed, 2, i, 0}: transform_images of the
  // gathered images gives the same bits.
  const auto order = data::epoch_permutation(n, 3, 2);
  for (std::size_t p = 0; p < order.size(); ++p) {
    const index_t i = order[p];
    const auto expected =
        data::transform_images(augment, set.images.slice(0, i, i + 1), 99, 2, static_cast<std::uint64_t>(i))
            .to_vector();
    REQUIRE(std::equal(expected.begin(), expected.end(),
                       one.first.begin() + static_cast<std::ptrdiff_t>(p * 192)));
    REQUIRE(one.second[p] == labels[static_cast<std::size_t>(i)]);
  }
}

TEST_CASE("data_loader: an exception in a worker reaches the caller at that batch", "[data][loader]") {
  for (index_t workers : {0, 1, 3}) {
    INFO("num_workers = " << workers);
    const toy_dataset ds{.n = 30, .fail_at = 13};
    data::data_loader loader(ds, data::sequential_sampler(30), {.batch_size = 4, .num_workers = workers});
    for (index_t k = 0; k < 3; ++k) check_batch(loader.next(), 4);    // samples 0..11
    CHECK_THROWS_WITH(loader.next(), Contains("corrupt sample 13"));  // batch 3: samples 12..15
    CHECK(loader.position() == 4);
    CHECK(loader.sampler().position() == 16);
    // The loader goes on with batch 4.
    const auto ids = check_batch(loader.next(), 4);
    CHECK(ids == std::vector<index_t>{16, 17, 18, 19});
    index_t rest = 0;
    while (loader.has_next()) rest += loader.next().y.numel();
    CHECK(rest == 10);
  }
  // A transform that throws for one sample, and a sampler index outside the dataset.
  struct picky {
    data::image_shape output_shape(const data::image_shape& s) const { return s; }
    void operator()(const float* in, const data::image_shape& s, float* out,
                    const data::sample_rng& rng) const {
      if (rng.index == 5) throw trainkit::value_error("picky: sample 5");
      std::copy(in, in + s.numel(), out);
    }
  };
  data::data_loader lt(toy_dataset{.n = 8}, data::sequential_sampler(8),
                       {.batch_size = 2, .num_workers = 2, .transform = picky{}});
  check_batch(lt.next(), 2);
  check_batch(lt.next(), 2);
  CHECK_THROWS_AS(lt.next(), trainkit::value_error);
  check_batch(lt.next(), 2);
}

TEST_CASE("data_loader: the prefetch queue is bounded", "[data][loader]") {
  const toy_dataset ds{.n = 200};
  data::data_loader loader(ds, data::sequential_sampler(200),
                           {.batch_size = 5, .num_workers = 3, .prefetch = 4});
  CHECK(loader.prefetch() == 4);
  CHECK(*ds.gets == 0);  // nothing starts before the first next()
  check_batch(loader.next(), 5);
  // Workers fill the queue (4 batches beyond the one handed out) and stop there.
  const auto until = clock_type::now() + std::chrono::seconds(5);
  while (*ds.gets < 25 && clock_type::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(*ds.gets == 25);
  check_batch(loader.next(), 5);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(*ds.gets == 30);
  // Default capacity: 2 per worker.
  data::data_loader d2(ds, data::sequential_sampler(200), {.batch_size = 5, .num_workers = 3});
  CHECK(d2.prefetch() == 6);
}

TEST_CASE("data_loader: destruction with a full queue, or mid-batch, joins every worker", "[data][loader]") {
  using loader_t = data::data_loader<toy_dataset>;
  const int before = thread_count();
  REQUIRE(before >= 1);
  SECTION("full queue: workers blocked waiting for room") {
    auto loader =
        std::make_unique<loader_t>(toy_dataset{.n = 1000}, data::sequential_sampler(1000),
                                   data::loader_options{.batch_size = 10, .num_workers = 4, .prefetch = 2});
    check_batch(loader->next(), 10);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    CHECK(thread_count() == before + 4);
    const auto t0 = clock_type::now();
    loader.reset();
    CHECK(clock_type::now() - t0 < std::chrono::milliseconds(500));
    CHECK(settled_thread_count(before) == before);
  }
  SECTION("mid-batch: slow samples, the workers stop between samples") {
    // 20 ms a sample, 50 samples a batch: a whole batch would take a second per worker.
    auto loader = std::make_unique<loader_t>(toy_dataset{.n = 400, .delay = std::chrono::milliseconds(20)},
                                             data::sequential_sampler(400),
                                             data::loader_options{.batch_size = 50, .num_workers = 3});
    CHECK(loader->wait_seconds() == 0.0);
    check_batch(loader->next(), 50);      // about a second
    CHECK(loader->wait_seconds() > 0.5);  // next() blocked while the batch was built
    const auto t0 = clock_type::now();
    loader.reset();
    CHECK(clock_type::now() - t0 < std::chrono::milliseconds(500));
    CHECK(settled_thread_count(before) == before);
  }
  SECTION("never started, or drained to the end") {
    {
      loader_t idle(toy_dataset{.n = 10}, data::sequential_sampler(10), {.batch_size = 2, .num_workers = 3});
    }
    CHECK(thread_count() == before);
    loader_t all(toy_dataset{.n = 10}, data::sequential_sampler(10), {.batch_size = 2, .num_workers = 3});
    while (all.has_next()) (void)all.next();
    // The workers of a finished pass are joined by the last next().
    CHECK(settled_thread_count(before) == before);
  }
  SECTION("set_epoch in the middle of a pass restarts cleanly") {
    loader_t loader(toy_dataset{.n = 60}, data::shuffled_sampler(60, 4), {.batch_size = 6, .num_workers = 3});
    (void)loader.next();
    loader.set_epoch(1);
    CHECK(settled_thread_count(before) == before);
    CHECK(loader.position() == 0);
    CHECK(flat(drain(loader, 6, 60)) == data::epoch_permutation(60, 4, 1));
  }
  CHECK(settled_thread_count(before) == before);
}

namespace {
// A batch_memory that binds its workers (the CUDA model sets the starting thread's device on each
// worker: without it every rank's pinned batches made a context on GPU 0): the context is read on
// the thread that starts the workers, and every batch is built on a worker that entered it.
thread_local int worker_context_seen = -1;
std::atomic<int> context_of_starter{0}, entered{0}, built_outside{0};
struct bound_memory {
  static constexpr bool pinned = false;
  static int worker_context() { return context_of_starter.load(); }
  static void enter_worker(int context) noexcept {
    worker_context_seen = context;
    entered.fetch_add(1);
  }
  template <trainkit::element T>
  static trainkit::tensor<T> empty(shape sizes) {
    if (worker_context_seen != context_of_starter.load()) built_outside.fetch_add(1);
    return trainkit::tensor<T>::empty(std::move(sizes));
  }
};
static_assert(data::binds_workers<bound_memory> && !data::binds_workers<data::pageable_memory>);
}  // namespace

TEST_CASE("data_loader: a memory policy binds the workers to the starting thread's context", "[data][loader]") {
  context_of_starter = 7;
  data::data_loader<toy_dataset, data::distributed_sampler, bound_memory> loader(
      toy_dataset{.n = 40}, data::sequential_sampler(40), {.batch_size = 4, .num_workers = 3});
  CHECK(flat(drain(loader, 4, 40)).size() == 40);
  CHECK(entered.load() == 3);
  CHECK(built_outside.load() == 0);
}

TEST_CASE("data_loader: resume from the sampler state", "[data][loader]") {
  const toy_dataset ds{.n = 45};
  data::distributed_sampler s(45, {.num_replicas = 2, .rank = 0, .seed = 21});  // 23 indices
  data::data_loader first(ds, s, {.batch_size = 4, .num_workers = 2});
  first.set_epoch(5);
  const auto whole = [&] {
    data::data_loader ref(ds, s, {.batch_size = 4, .num_workers = 1});
    ref.set_epoch(5);
    return drain(ref, 4, 23);
  }();
  REQUIRE(whole.size() == 6);
  for (int k = 0; k < 3; ++k) CHECK(check_batch(first.next(), 4) == whole[static_cast<std::size_t>(k)]);
  const auto st = first.get_state();
  CHECK(st == data::distributed_sampler::state{5, 12, 2, 0});

  // A new process: the same dataset and sampler settings, restored state.
  data::data_loader second(ds, data::distributed_sampler(45, {.num_replicas = 2, .rank = 0, .seed = 21}),
                           {.batch_size = 4, .num_workers = 3});
  second.set_state(st);
  CHECK(second.epoch() == 5);
  CHECK(second.size() == 3);  // the rest of the epoch: 11 indices
  const auto rest = drain(second, 4, 11);
  CHECK(rest == std::vector<std::vector<index_t>>(whole.begin() + 3, whole.end()));
  second.set_epoch(6);
  CHECK(second.size() == 6);
}

TEST_CASE("data_loader: validation", "[data][loader]") {
  const toy_dataset ds{.n = 10};
  CHECK_THROWS_WITH(data::data_loader(ds, data::sequential_sampler(10), {.batch_size = 0}),
                    Contains("batch_size must be >= 1"));
  CHECK_THROWS_AS(data::data_loader(ds, data::sequential_sampler(10), {.num_workers = -1}),
                  trainkit::value_error);
  CHECK_THROWS_WITH(data::data_loader(ds, data::sequential_sampler(11), {}),
                    Contains("11 samples") && Contains("only 10"));
  // A transform needs [C, H, W] samples of the right channel count.
  const tensor<float> flat_x = tensor<float>::zeros({4, 6});
  const tensor<std::int64_t> y = tensor<std::int64_t>::zeros({4});
  CHECK_THROWS_WITH(data::data_loader(data::tensor_dataset(flat_x, y), data::sequential_sampler(4),
                                      {.transform = data::random_horizontal_flip()}),
                    Contains("data_loader") && Contains("[C, H, W]") && Contains("[6]"));
  CHECK_THROWS_AS(data::data_loader(ds, data::sequential_sampler(10),
                                    {.transform = data::normalize({.mean = {0, 0, 0}, .stddev = {1, 1, 1}})}),
                  trainkit::shape_error);
  CHECK_THROWS_AS(data::tensor_dataset(flat_x, tensor<std::int64_t>::zeros({3})), trainkit::shape_error);
  // tensor_dataset reads a loaded dataset; the transform's output shape sizes the batch.
  data::data_loader crop(ds, data::sequential_sampler(10),
                         {.batch_size = 3, .transform = data::random_crop({.height = 2, .width = 2})});
  CHECK(crop.sample_shape() == shape{2, 2, 2});
  CHECK(crop.next().x.sizes() == shape{3, 2, 2, 2});
}
