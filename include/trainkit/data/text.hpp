// trainkit/data/text.hpp - text for language models: a file read whole, a character vocabulary
// (the distinct bytes of the text, sorted), and token_windows, the indexable dataset of a token
// stream's windows with their next tokens as labels - what a data_loader batches into int64
// x [B, T] and y [B, T] for train_step and evaluate.
//
//   const std::string text = data::read_text_file("corpus.txt");
//   data::char_vocabulary vocab(text);
//   data::token_windows train(vocab.encode(text), /*context=*/128);
//   data::data_loader loader(train, data::distributed_sampler(train.size(), {}), {.batch_size = 32});
#pragma once

#include <array>
#include <cstdint>
#include <cstring>  // std::memcpy
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

#include "trainkit/core/error.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/core/tensor.hpp"

namespace trainkit::data {

/// The whole file as bytes; io_error naming the path when it cannot be read.
inline std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TRAINKIT_CHECK(static_cast<bool>(in), io_error, "read_text_file", "cannot open '" << path << "'");
  std::ostringstream s;
  s << in.rdbuf();
  TRAINKIT_CHECK(!in.bad(), io_error, "read_text_file", "reading '" << path << "' failed");
  return std::move(s).str();
}

/// Characters (bytes) as token ids 0 .. size() - 1: the distinct bytes of a text in byte order.
class char_vocabulary {
 public:
  /// The vocabulary of `text` (value_error when it is empty).
  explicit char_vocabulary(std::string_view text) {
    std::array<bool, 256> seen{};
    for (unsigned char c : text) seen[c] = true;
    for (int c = 0; c < 256; ++c)
      if (seen[std::size_t(c)]) symbols_.push_back(static_cast<char>(c));
    TRAINKIT_CHECK(!symbols_.empty(), value_error, "char_vocabulary", "the text is empty");
    index_symbols();
  }
  /// A vocabulary from its symbols (symbols(): what a snapshot keeps), in that order.
  static char_vocabulary from_symbols(std::string symbols) {
    char_vocabulary v;
    v.symbols_ = std::move(symbols);
    TRAINKIT_CHECK(!v.symbols_.empty(), value_error, "char_vocabulary", "no symbols");
    v.index_symbols();
    return v;
  }

  index_t size() const noexcept { return index_t(symbols_.size()); }
  const std::string& symbols() const noexcept { return symbols_; }

  /// The id of byte c; value_error naming it when the vocabulary does not hold it.
  std::int64_t id(char c) const {
    const int i = ids_[static_cast<unsigned char>(c)];
    TRAINKIT_CHECK(i >= 0, value_error, "char_vocabulary",
                   "byte " << int(static_cast<unsigned char>(c)) << " is not in the vocabulary of " << size()
                           << " symbols");
    return i;
  }
  /// The byte of id; index_error naming it when out of [0, size()).
  char symbol(std::int64_t id) const {
    TRAINKIT_CHECK(id >= 0 && id < size(), index_error, "char_vocabulary",
                   "token id " << id << " is outside [0, " << size() << ")");
    return symbols_[std::size_t(id)];
  }

  /// The ids of text, [text.size()].
  tensor<std::int64_t> encode(std::string_view text) const {
    auto t = tensor<std::int64_t>::empty({index_t(text.size())});
    std::int64_t* p = t.data();
    for (char c : text) *p++ = id(c);
    return t;
  }
  /// The text of n ids.
  std::string decode(const std::int64_t* ids, index_t n) const {
    std::string s;
    s.reserve(std::size_t(n));
    for (index_t i = 0; i < n; ++i) s.push_back(symbol(ids[i]));
    return s;
  }

 private:
  char_vocabulary() = default;
  void index_symbols() {
    ids_.fill(-1);
    for (std::size_t i = 0; i < symbols_.size(); ++i) {
      const auto c = static_cast<unsigned char>(symbols_[i]);
      TRAINKIT_CHECK(ids_[c] < 0, value_error, "char_vocabulary", "byte " << int(c) << " appears twice");
      ids_[c] = int(i);
    }
  }
  std::string symbols_;
  std::array<int, 256> ids_{};
};

/// The windows of a token stream as an indexable_dataset of token ids: sample i is
/// tokens[i s, i s + T) and its labels the next tokens, tokens[i s + 1, i s + T + 1) (T = context,
/// s = stride, default T: windows that do not overlap). Shares the token tensor.
class token_windows {
 public:
  using input_type = std::int64_t;

  token_windows(const tensor<std::int64_t>& tokens, index_t context, index_t stride = 0)
      : tokens_(tokens.contiguous()), context_(context), stride_(stride > 0 ? stride : context) {
    TRAINKIT_CHECK(tokens.dim() == 1, shape_error, "token_windows",
                   "tokens must be a 1-D stream, got sizes " << trainkit::to_string(tokens.sizes()));
    TRAINKIT_CHECK(context >= 1 && stride >= 0, value_error, "token_windows",
                   "context must be >= 1 and stride >= 0, got context " << context << ", stride " << stride);
    TRAINKIT_CHECK(tokens.numel() >= context + 1, value_error, "token_windows",
                   "a window of " << context << " tokens and its next tokens need " << context + 1
                                  << " tokens; the stream has " << tokens.numel());
    n_ = (tokens.numel() - 1 - context) / stride_ + 1;
  }

  index_t size() const noexcept { return n_; }
  shape sample_shape() const { return {context_}; }
  shape label_shape() const { return {context_}; }
  index_t context() const noexcept { return context_; }

  void get(index_t i, std::int64_t* x, std::int64_t* y) const {
    TRAINKIT_CHECK(i >= 0 && i < n_, index_error, "token_windows::get", "window " << i << " is outside [0, " << n_ << ")");
    const std::int64_t* p = tokens_.data() + i * stride_;
    std::memcpy(x, p, std::size_t(context_) * sizeof(std::int64_t));
    std::memcpy(y, p + 1, std::size_t(context_) * sizeof(std::int64_t));
  }

  const tensor<std::int64_t>& tokens() const noexcept { return tokens_; }

 private:
  tensor<std::int64_t> tokens_;
  index_t context_, stride_, n_ = 0;
};

}  // namespace trainkit::data
