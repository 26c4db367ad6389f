// gguf::Writer: GGUF v3 files, written atomically, tensor data streamed
// from producers one tensor at a time.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "encore/gguf.h"
#include "gguf/internal.h"
#include "util/temp_file.h"
#include "util/text.h"

namespace encore::gguf {
namespace {

void check_tensor(const std::string& name, DType type, const std::vector<uint64_t>& dims,
                  uint64_t* n_bytes) {
  auto bad = [&](std::string what) {
    throw InvalidArgument(fmt::format("gguf writer: tensor '{}': {}", util::printable(name), what));
  };
  if (name.empty()) bad("empty tensor name");
  if (name.size() > detail::kMaxTensorNameBytes) {
    bad(fmt::format("name is {} bytes long; at most {} allowed", name.size(),
                    detail::kMaxTensorNameBytes));
  }
  const DTypeInfo* info = dtype_info(static_cast<uint32_t>(type));
  if (info == nullptr) bad(fmt::format("unknown type id {}", static_cast<uint32_t>(type)));
  if (dims.empty() || dims.size() > detail::kMaxDims) {
    bad(fmt::format("{} dims; expected 1 to {}", dims.size(), detail::kMaxDims));
  }
  for (uint64_t d : dims) {
    if (d == 0) bad(fmt::format("zero-sized dimension in {}", shape_string(dims)));
  }
  if (dims[0] % info->block_elems != 0) {
    bad(fmt::format("row length dims[0] = {} is not a multiple of the {} block size {}", dims[0],
                    info->name, info->block_elems));
  }
  uint64_t n_elements = 1;
  for (uint64_t d : dims) {
    if (__builtin_mul_overflow(n_elements, d, &n_elements) || n_elements > uint64_t{INT64_MAX}) {
      bad(fmt::format("dims {} hold more than 2^63 elements", shape_string(dims)));
    }
  }
  if (!detail::tensor_n_bytes(type, dims, n_bytes)) {
    bad(fmt::format("size of dims {} overflows", shape_string(dims)));
  }
}

}  // namespace

Writer::Writer(uint32_t alignment) : alignment_(alignment) {
  if (!detail::is_power_of_two(alignment)) {
    throw InvalidArgument(
        fmt::format("gguf writer: alignment {} is not a nonzero power of two", alignment));
  }
  // The reader assumes 32 when the key is absent, so any other value must be
  // recorded in the file.
  if (alignment != detail::kDefaultAlignment) {
    kv_.emplace_back("general.alignment", Value::make_u32(alignment));
  }
}

void Writer::set(std::string key, Value value) {
  detail::check_key(key);
  detail::check_value(value, key);
  if (key == "general.alignment") {
    if (value.type != ValueType::UINT32 || !detail::is_power_of_two(value.u)) {
      throw InvalidArgument(
          fmt::format("gguf writer: general.alignment must be a uint32 power of two, got {} {}",
                      value_type_name(value.type), value.to_string()));
    }
    alignment_ = static_cast<uint32_t>(value.u);
  }
  for (auto& [k, v] : kv_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  kv_.emplace_back(std::move(key), std::move(value));
}

void Writer::add_tensor(std::string name, DType type, std::vector<uint64_t> dims,
                        std::vector<uint8_t> data) {
  uint64_t n_bytes = 0;
  check_tensor(name, type, dims, &n_bytes);
  if (data.size() != n_bytes) {
    throw InvalidArgument(fmt::format(
        "gguf writer: tensor '{}': {} bytes of data given, but {} {} needs {}",
        util::printable(name), data.size(), dtype_name(type), shape_string(dims), n_bytes));
  }
  Producer none;
  add_tensor(std::move(name), type, std::move(dims), none);
  tensors_.back().data = std::move(data);
}

void Writer::add_tensor(std::string name, DType type, std::vector<uint64_t> dims,
                        Producer producer) {
  uint64_t n_bytes = 0;
  check_tensor(name, type, dims, &n_bytes);
  for (const PendingTensor& t : tensors_) {
    if (t.name == name) {
      throw InvalidArgument(
          fmt::format("gguf writer: duplicate tensor name '{}'", util::printable(name)));
    }
  }
  tensors_.push_back({std::move(name), type, std::move(dims), n_bytes, {}, std::move(producer)});
}

std::vector<uint8_t> Writer::header_bytes(std::vector<uint64_t>* offsets,
                                          uint64_t* total_size) const {
  std::vector<uint8_t> out;
  detail::append_u32(out, detail::kMagic);
  detail::append_u32(out, detail::kVersion);
  detail::append_u64(out, tensors_.size());
  detail::append_u64(out, kv_.size());
  for (const auto& [key, value] : kv_) detail::append_kv(out, key, value);

  // Every tensor starts aligned and is padded to the alignment, as ggml does.
  offsets->clear();
  uint64_t data_size = 0;
  for (const PendingTensor& t : tensors_) {
    offsets->push_back(data_size);
    if (__builtin_add_overflow(data_size, t.n_bytes, &data_size) ||
        !detail::align_up(data_size, alignment_, &data_size)) {
      throw Error("gguf writer: total tensor data size overflows uint64");
    }
  }
  for (size_t k = 0; k < tensors_.size(); ++k) {
    const PendingTensor& t = tensors_[k];
    detail::append_string(out, t.name);
    detail::append_u32(out, static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) detail::append_u64(out, d);
    detail::append_u32(out, static_cast<uint32_t>(t.type));
    detail::append_u64(out, (*offsets)[k]);
  }
  uint64_t header_size = 0;
  detail::align_up(out.size(), alignment_, &header_size);
  out.resize(header_size, 0);
  if (__builtin_add_overflow(header_size, data_size, total_size)) {
    throw Error("gguf writer: total file size overflows uint64");
  }
  return out;
}

void Writer::write(const std::string& path) const {
  std::vector<uint64_t> offsets;
  uint64_t total = 0;
  const std::vector<uint8_t> header = header_bytes(&offsets, &total);

  uint64_t max_produced = 0;
  for (const PendingTensor& t : tensors_) {
    if (t.producer) max_produced = std::max(max_produced, t.n_bytes);
  }
  std::vector<uint8_t> buffer(max_produced);  // reused by every producer
  const std::vector<uint8_t> zeros(alignment_, 0);

  util::TempFile file(path);
  file.write(header.data(), header.size());
  uint64_t pos = 0;  // within the data section
  for (size_t k = 0; k < tensors_.size(); ++k) {
    const PendingTensor& t = tensors_[k];
    file.write(zeros.data(), offsets[k] - pos);
    if (t.producer) {
      t.producer(buffer.data(), t.n_bytes);
      file.write(buffer.data(), t.n_bytes);
    } else {
      file.write(t.data.data(), t.n_bytes);
    }
    pos = offsets[k] + t.n_bytes;
  }
  file.write(zeros.data(), total - header.size() - pos);
  file.commit();
}

std::vector<uint8_t> Writer::to_bytes() const {
  std::vector<uint64_t> offsets;
  uint64_t total = 0;
  std::vector<uint8_t> out = header_bytes(&offsets, &total);
  const uint64_t base = out.size();
  out.resize(total, 0);
  for (size_t k = 0; k < tensors_.size(); ++k) {
    const PendingTensor& t = tensors_[k];
    uint8_t* dst = out.data() + base + offsets[k];
    if (t.producer) {
      t.producer(dst, t.n_bytes);
    } else if (t.n_bytes > 0) {
      std::memcpy(dst, t.data.data(), t.n_bytes);
    }
  }
  return out;
}

}  // namespace encore::gguf
