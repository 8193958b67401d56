// trainkit/io/snapshot_section.hpp - one section of a snapshot: named records (tensors, integers,
// reals, strings) in the order they were put, read back with checks that name the record, the
// section, the file and the byte offset (io/snapshot.hpp holds the whole snapshot).
#pragma once

#include <algorithm>  // std::min
#include <array>
#include <bit>  // std::bit_cast
#include <cstddef>
#include <cstdint>
#include <cstring>  // std::memcpy
#include <deque>    // sections keep their addresses as more are added
#include <filesystem>
#include <fstream>  // reading a whole file
#include <memory>   // std::shared_ptr: the bytes of a read file, shared by its records
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "trainkit/core/device.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/core/error.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/io/atomic_file.hpp"
#include "trainkit/io/format.hpp"

namespace trainkit::io {

class snapshot;

/// One named group of records ("model", "optimizer", "rng.default"...). Records are kept in the
/// order they were put; names are unique within the section.
class snapshot_section {
 public:
  /// What a record holds, without its bytes.
  struct record_info {
    std::string name;
    record_kind kind;
    dtype_code dtype = dtype_code::float32;  // tensors only
    shape sizes;                             // tensors only
    std::uint64_t file_offset = 0;           // where the record starts in the file it came from
  };

  const std::string& name() const noexcept { return name_; }
  std::size_t size() const noexcept { return records_.size(); }
  bool empty() const noexcept { return records_.empty(); }
  bool contains(std::string_view record) const { return find(record) != nullptr; }
  /// The record names in order.
  std::vector<std::string> names() const {
    std::vector<std::string> r;
    r.reserve(records_.size());
    for (const auto& rec : records_) r.push_back(rec.info.name);
    return r;
  }
  /// Kind, dtype, sizes and offset of a record; io_error when there is none.
  const record_info& info(std::string_view record) const { return require(record).info; }

  // ---- building ------------------------------------------------------------------------------
  /// Copies t's elements (t may be a view on any device; it is read once, now).
  template <element T, class D>
  snapshot_section& put_tensor(std::string record, const tensor<T, D>& t) {
    TRAINKIT_CHECK(t.defined(), usage_error, "snapshot::put_tensor",
                   "record '" << record << "' of section '" << name_ << "': the tensor is undefined");
    entry& e = add(std::move(record), record_kind::tensor);
    e.info.dtype = dtype_code_of<T>();
    e.info.sizes = t.sizes();
    const std::size_t n = static_cast<std::size_t>(t.numel()) * sizeof(T);
    auto buf = std::make_shared<std::vector<std::byte>>(n);
    if (n > 0) {
      if constexpr (std::is_same_v<D, cpu>) {
        const tensor<T, D> c = t.contiguous();
        std::memcpy(buf->data(), c.data(), n);
      } else {
        const tensor<T, cpu> c = t.template to<cpu>().contiguous();
        std::memcpy(buf->data(), c.data(), n);
      }
    }
    e.bytes = std::move(buf);
    e.begin = 0;
    e.length = n;
    return *this;
  }
  snapshot_section& put_int(std::string record, std::int64_t v) {
    add(std::move(record), record_kind::integer).integer = v;
    return *this;
  }
  snapshot_section& put_real(std::string record, double v) {
    add(std::move(record), record_kind::real).real = v;
    return *this;
  }
  snapshot_section& put_string(std::string record, std::string v) {
    add(std::move(record), record_kind::string).text = std::move(v);
    return *this;
  }

  // ---- reading -------------------------------------------------------------------------------
  /// The tensor record as a new tensor<T, D>; io_error when the record is missing, is not a
  /// tensor or holds another element type.
  template <element T, class D = cpu>
  tensor<T, D> get_tensor(std::string_view record) const {
    const entry& e = require(record);
    check_kind(e, record_kind::tensor);
    TRAINKIT_CHECK(e.info.dtype == dtype_code_of<T>(), io_error, "snapshot",
                   where(e) << " is a " << to_string(e.info.dtype) << " tensor of shape "
                            << trainkit::to_string(e.info.sizes) << ", read as " << dtype_name<T>());
    tensor<T, cpu> t = tensor<T, cpu>::empty(e.info.sizes);
    TRAINKIT_CHECK(
        e.length == static_cast<std::size_t>(t.numel()) * sizeof(T), io_error, "snapshot",
        where(e) << " holds " << e.length << " bytes for shape " << trainkit::to_string(e.info.sizes));
    if (e.length > 0) std::memcpy(t.data(), e.bytes->data() + e.begin, e.length);
    if constexpr (std::is_same_v<D, cpu>)
      return t;
    else
      return t.template to<D>();
  }
  /// As get_tensor(record), and the shape must be `expected`.
  template <element T, class D = cpu>
  tensor<T, D> get_tensor(std::string_view record, const shape& expected) const {
    const entry& e = require(record);
    check_kind(e, record_kind::tensor);
    TRAINKIT_CHECK(e.info.sizes == expected, io_error, "snapshot",
                   where(e) << " has shape " << trainkit::to_string(e.info.sizes) << ", expected "
                            << trainkit::to_string(expected));
    return get_tensor<T, D>(record);
  }
  std::int64_t get_int(std::string_view record) const {
    const entry& e = require(record);
    check_kind(e, record_kind::integer);
    return e.integer;
  }
  double get_real(std::string_view record) const {
    const entry& e = require(record);
    check_kind(e, record_kind::real);
    return e.real;
  }
  const std::string& get_string(std::string_view record) const {
    const entry& e = require(record);
    check_kind(e, record_kind::string);
    return e.text;
  }

  /// "record 'x' of section 's' (file 'f', byte offset n)": the prefix of every message about a
  /// record, public so that state loaders can say what they expected of it.
  std::string describe(std::string_view record) const {
    if (const entry* e = find(record)) return where(*e);
    return "record '" + std::string(record) + "' of section '" + name_ + "'" + origin();
  }
  /// " (file 'f')" for a section read from a file, "" for one built in memory.
  std::string origin() const { return source_.empty() ? std::string() : " (file '" + source_ + "')"; }

 private:
  friend class snapshot;
  friend struct snapshot_codec;

  struct entry {
    record_info info;
    std::int64_t integer = 0;
    double real = 0.0;
    std::string text;
    std::shared_ptr<const std::vector<std::byte>> bytes;  // tensors: the elements are
    std::size_t begin = 0, length = 0;                    // bytes[begin, begin + length)
  };

  snapshot_section(std::string name, std::string source, std::uint64_t offset)
      : name_(std::move(name)), source_(std::move(source)), offset_(offset) {}

  entry& add(std::string record, record_kind kind) {
    TRAINKIT_CHECK(!record.empty(), usage_error, "snapshot::put",
                   "empty record name in section '" << name_ << "'");
    TRAINKIT_CHECK(index_.find(record) == index_.end(), usage_error, "snapshot::put",
                   "section '" << name_ << "' already has a record '" << record << "'");
    index_.emplace(record, records_.size());
    entry e;
    e.info.name = std::move(record);
    e.info.kind = kind;
    records_.push_back(std::move(e));
    return records_.back();
  }
  const entry* find(std::string_view record) const {
    auto it = index_.find(std::string(record));
    return it == index_.end() ? nullptr : &records_[it->second];
  }
  const entry& require(std::string_view record) const {
    const entry* e = find(record);
    if (e == nullptr) {
      std::string known;
      for (std::size_t i = 0; i < records_.size() && i < 8; ++i)
        known += (i ? ", '" : "'") + records_[i].info.name + "'";
      if (records_.size() > 8) known += ", ...";
      TRAINKIT_CHECK(false, io_error, "snapshot",
                     "section '" << name_ << "'" << origin() << (source_.empty() ? "" : " at byte offset ")
                                 << (source_.empty() ? std::string() : std::to_string(offset_))
                                 << " has no record '" << record << "' (it has "
                                 << (records_.empty() ? std::string("none") : known) << ")");
    }
    return *e;
  }
  std::string where(const entry& e) const {
    std::string s = "record '" + e.info.name + "' of section '" + name_ + "'";
    if (!source_.empty())
      s += " (file '" + source_ + "', byte offset " + std::to_string(e.info.file_offset) + ")";
    return s;
  }
  void check_kind(const entry& e, record_kind want) const {
    TRAINKIT_CHECK(e.info.kind == want, io_error, "snapshot",
                   where(e) << " is a" << (e.info.kind == record_kind::integer ? "n " : " ")
                            << to_string(e.info.kind) << ", read as a"
                            << (want == record_kind::integer ? "n " : " ") << to_string(want));
  }

  std::string name_;
  std::string source_;        // the file it was read from ("" when built in memory)
  std::uint64_t offset_ = 0;  // where the section starts in that file
  std::vector<entry> records_;
  std::unordered_map<std::string, std::size_t> index_;
};

}  // namespace trainkit::io
