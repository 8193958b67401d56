// tests/data/test_text.cpp - text for language models: the character vocabulary (round trip,
// errors naming the byte or id), read_text_file, token_windows (windows and next-token labels,
// stride, errors) and the data_loader batching int64 token windows into x [B, T], y [B, T] - with
// and without workers, the same batches - and refusing an image transform on them.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "support/errors.hpp"
#include "trainkit/trainkit.hpp"

using namespace trainkit;
using Catch::Matchers::Contains;

namespace text_test {

using trainkit::test::error_message;

tensor<std::int64_t> iota(index_t n) {
  auto t = tensor<std::int64_t>::empty({n});
  for (index_t i = 0; i < n; ++i) t.data()[i] = i;
  return t;
}

TEST_CASE("char_vocabulary: distinct bytes in byte order, encode and decode round trip", "[data][text]") {
  const data::char_vocabulary v("hello, world\n");
  CHECK(v.symbols() == std::string("\n ,dehlorw"));
  CHECK(v.size() == 10);
  const auto ids = v.encode("hello");
  CHECK(ids.to_vector() == std::vector<std::int64_t>{5, 4, 6, 6, 7});
  CHECK(v.decode(ids.data(), ids.numel()) == "hello");
  CHECK(data::char_vocabulary::from_symbols(v.symbols()).encode("world").to_vector() == v.encode("world").to_vector());
  CHECK_THAT(error_message([&] { v.encode("hex"); }), Contains("byte 120") && Contains("10 symbols"));
  CHECK_THAT(error_message([&] { v.symbol(10); }), Contains("token id 10") && Contains("[0, 10)"));
  CHECK_THAT(error_message([] { data::char_vocabulary(""); }), Contains("empty"));
  CHECK_THAT(error_message([] { data::read_text_file("/nonexistent/corpus.txt"); }),
             Contains("read_text_file") && Contains("/nonexistent/corpus.txt"));
}

TEST_CASE("token_windows: windows of T tokens labelled with the next T", "[data][text]") {
  const data::token_windows w(iota(21), 4);
  REQUIRE(w.size() == 5);  // windows start at 0, 4, 8, 12, 16; the last needs tokens up to 20
  CHECK(w.sample_shape() == shape{4});
  CHECK(w.label_shape() == shape{4});
  std::int64_t x[4], y[4];
  w.get(4, x, y);
  CHECK(std::vector<std::int64_t>(x, x + 4) == std::vector<std::int64_t>{16, 17, 18, 19});
  CHECK(std::vector<std::int64_t>(y, y + 4) == std::vector<std::int64_t>{17, 18, 19, 20});
  const data::token_windows overlapping(iota(21), 4, 1);
  CHECK(overlapping.size() == 17);
  CHECK_THAT(error_message([&] { w.get(5, x, y); }), Contains("window 5") && Contains("[0, 5)"));
  CHECK_THAT(error_message([] { data::token_windows(iota(4), 4); }), Contains("need 5 tokens") && Contains("has 4"));
  CHECK_THAT(error_message([] { data::token_windows(iota(8).reshape({2, 4}), 2); }), Contains("1-D"));
}

TEST_CASE("data_loader batches token windows as int64 x [B, T] and y [B, T], whatever the workers",
          "[data][text][loader]") {
  const data::token_windows w(iota(64), 5);  // 12 windows
  auto batches_of = [&](index_t workers) {
    data::data_loader loader(w, data::distributed_sampler(w.size(), {.shuffle = true, .seed = 3}),
                             {.batch_size = 5, .num_workers = workers});
    static_assert(std::is_same_v<decltype(loader.next()), data::batch<std::int64_t>>);
    loader.set_epoch(1);
    std::vector<std::vector<std::int64_t>> out;
    for (auto& b : loader) {
      CHECK(b.x.dim() == 2);
      CHECK(b.x.size(1) == 5);
      CHECK(b.y.sizes() == b.x.sizes());
      const auto x = b.x.to_vector(), y = b.y.to_vector();
      for (std::size_t i = 0; i < x.size(); ++i) CHECK(y[i] == x[i] + 1);  // the next token
      out.push_back(x);
    }
    return out;
  };
  const auto serial = batches_of(0);
  REQUIRE(serial.size() == 3);  // 5 + 5 + 2 windows
  CHECK(serial.back().size() == 2 * 5);
  CHECK(batches_of(2) == serial);
  CHECK_THAT(error_message([&] {
               data::data_loader loader(w, data::distributed_sampler(w.size(), {}),
                                        {.batch_size = 2, .transform = data::random_crop({.padding = 1})});
             }),
             Contains("transform") && Contains("int64 token ids"));
}

}  // namespace text_test
