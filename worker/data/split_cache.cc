#include "worker/data/split_cache.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>
#include <zlib.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iterator>
#include <vector>

#include "common/byte_order.h"
#include "common/file_bytes.h"
#include "common/log.h"

namespace dlaunch::data {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr char kMagic[8] = {'D', 'T', 'S', 'P', 'L', 'I', 'T', '1'};

std::string file_for(const std::string& dir, const std::string& key) {
  return (fs::path(dir) / fmt::format("data_{:016x}.bin", std::hash<std::string>{}(key))).string();
}

json fields(const ImageDataset& d) {
  // Resampled datasets: each image's offset and size, as three flat arrays.
  std::vector<int64_t> offsets;
  std::vector<int32_t> heights, widths;
  for (const StoredImage& im : d.stored) {
    offsets.push_back(im.offset);
    heights.push_back(im.height);
    widths.push_back(im.width);
  }
  return {{"stored_offsets", offsets}, {"stored_heights", heights}, {"stored_widths", widths},
          {"name", d.name},          {"channels", d.channels},   {"height", d.height},
          {"width", d.width},        {"num_classes", d.num_classes}, {"mean", d.mean},
          {"stddev", d.stddev},      {"classes", d.classes},     {"sources", d.sources},
          {"skipped_bad_images", d.skipped_bad_images}, {"ignored_files", d.ignored_files},
          {"ignored_example", d.ignored_example}};
}

void set_fields(const json& j, ImageDataset& d) {
  d.name = j.at("name");
  d.channels = j.at("channels");
  d.height = j.at("height");
  d.width = j.at("width");
  d.num_classes = j.at("num_classes");
  d.mean = j.at("mean").get<std::vector<float>>();
  d.stddev = j.at("stddev").get<std::vector<float>>();
  d.classes = j.at("classes").get<std::vector<std::string>>();
  d.sources = j.at("sources").get<std::vector<std::string>>();
  d.skipped_bad_images = j.at("skipped_bad_images").get<std::vector<std::string>>();
  d.ignored_files = j.at("ignored_files");
  d.ignored_example = j.at("ignored_example");
  const auto offsets = j.at("stored_offsets").get<std::vector<int64_t>>();
  const auto heights = j.at("stored_heights").get<std::vector<int32_t>>();
  const auto widths = j.at("stored_widths").get<std::vector<int32_t>>();
  if (heights.size() != offsets.size() || widths.size() != offsets.size())
    throw json::other_error::create(501, "stored image arrays of different lengths", nullptr);
  for (size_t i = 0; i < offsets.size(); ++i) d.stored.push_back({offsets[i], heights[i], widths[i]});
}

void put_block(std::vector<uint8_t>& out, const std::vector<uint8_t>& v) {
  uint8_t n[8];
  store_le<uint64_t>(n, v.size());
  out.insert(out.end(), n, n + 8);
  out.insert(out.end(), v.begin(), v.end());
}

// Reads a u64-prefixed block at `pos`; false when it runs past `end`.
bool take_block(const std::vector<uint8_t>& in, size_t& pos, size_t end, std::vector<uint8_t>& v) {
  if (end - pos < 8) return false;
  uint64_t n = load_le<uint64_t>(in.data() + pos);
  pos += 8;
  if (n > end - pos) return false;
  v.assign(in.begin() + static_cast<std::ptrdiff_t>(pos), in.begin() + static_cast<std::ptrdiff_t>(pos + n));
  pos += n;
  return true;
}

}  // namespace

std::string split_cache_key(const std::string& dataset, const std::string& data_dir, uint64_t seed,
                            const ImageFolderOptions& options) {
  std::error_code ec;
  fs::path abs = fs::absolute(data_dir, ec);
  return json{{"dataset", dataset},
              {"data_dir", dataset == "synthetic" ? std::string() : (ec ? data_dir : abs.string())},
              {"seed", seed},
              {"skip_bad_images", options.skip_bad_images},
              {"image_size", options.image_size},
              {"max_decoded_bytes", options.max_decoded_bytes}}
      .dump();
}

std::optional<DatasetSplits> read_split_cache(const std::string& dir, const std::string& key) {
  const std::string path = file_for(dir, key);
  std::optional<std::vector<uint8_t>> read = read_file_bytes(path);
  if (!read) return std::nullopt;
  const std::vector<uint8_t>& in = *read;
  auto bad = [&](const char* why) -> std::optional<DatasetSplits> {
    log_warning("ignoring the data copy {} in the flash directory: {}; loading the data again",
                path, why);
    return std::nullopt;
  };
  if (in.size() < sizeof(kMagic) + 8 + 4 || std::memcmp(in.data(), kMagic, sizeof(kMagic)) != 0) {
    return bad("not a dtrain data copy");
  }
  const size_t end = in.size() - 4;
  if (static_cast<uint32_t>(crc32_z(crc32_z(0L, Z_NULL, 0), in.data(), end)) !=
      load_le<uint32_t>(in.data() + end)) {
    return bad("its CRC-32 does not match (torn or damaged)");
  }
  try {
    size_t pos = sizeof(kMagic);
    std::vector<uint8_t> meta_bytes;
    if (!take_block(in, pos, end, meta_bytes)) return bad("truncated metadata");
    const json meta = json::parse(meta_bytes.begin(), meta_bytes.end());
    if (meta.at("key") != key) return std::nullopt;  // another load hashed to the same name
    DatasetSplits s;
    for (auto [name, d] : {std::pair{"train", &s.train}, std::pair{"test", &s.test}}) {
      set_fields(meta.at(name), *d);
      if (!take_block(in, pos, end, d->pixels) || !take_block(in, pos, end, d->labels)) {
        return bad("truncated pixels or labels");
      }
      const bool consistent =
          d->resampled()
              ? static_cast<int64_t>(d->stored.size()) == d->size() &&
                    (d->stored.empty() ||
                     d->stored.back().offset + d->channels * d->stored.back().height *
                                                   d->stored.back().width ==
                         static_cast<int64_t>(d->pixels.size()))
              : static_cast<int64_t>(d->pixels.size()) == d->size() * d->image_elems();
      if (!consistent) {
        return bad("pixel and label counts disagree");
      }
    }
    return s;
  } catch (const json::exception& e) {
    return bad(e.what());
  }
}

void write_split_cache(const std::string& dir, const std::string& key, const DatasetSplits& splits) {
  const std::string path = file_for(dir, key);
  std::vector<uint8_t> out(kMagic, kMagic + sizeof(kMagic));
  const std::string meta = json{{"key", key}, {"train", fields(splits.train)}, {"test", fields(splits.test)}}.dump();
  put_block(out, std::vector<uint8_t>(meta.begin(), meta.end()));
  for (const ImageDataset* d : {&splits.train, &splits.test}) {
    put_block(out, d->pixels);
    put_block(out, d->labels);
  }
  uint8_t crc[4];
  store_le<uint32_t>(crc, static_cast<uint32_t>(crc32_z(crc32_z(0L, Z_NULL, 0), out.data(), out.size())));
  out.insert(out.end(), crc, crc + 4);
  // Temporary name, then rename: several local ranks may write it at once; each rename is whole.
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  std::error_code ec;
  fs::create_directories(dir, ec);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  bool ok = fd >= 0;
  int err = ok ? 0 : errno;
  for (size_t done = 0; ok && done < out.size();) {
    ssize_t w = ::write(fd, out.data() + done, out.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      ok = false;
      err = errno;
    } else {
      done += static_cast<size_t>(w);
    }
  }
  if (fd >= 0) ::close(fd);
  if (ok && ::rename(tmp.c_str(), path.c_str()) != 0) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    ::unlink(tmp.c_str());
    log_warning("could not keep the data in the flash directory ({}: {}); a restarted worker "
                "loads it again",
                path, std::strerror(err));
  }
}

}  // namespace dlaunch::data
