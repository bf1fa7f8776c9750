// torchvision's ImageFolder layout from a directory or a tar archive (see dataset.h).
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <thread>

#include "worker/data/dataset.h"
#include "worker/data/file_tree.h"
#include "worker/data/image_decode.h"

namespace dlaunch::data {
namespace {

constexpr const char* kLayout =
    "expected train/ and test/ (or val/) with one sub-folder per class, at the top of --data_dir "
    "or inside one top-level folder (torchvision's ImageFolder layout)";

bool is_image_name(const std::string& path) {
  const auto dot = path.rfind('.');
  if (dot == std::string::npos || path.find('/', dot) != std::string::npos) return false;
  std::string ext = path.substr(dot + 1);
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char ch) { return std::tolower(ch); });
  return ext == "jpg" || ext == "jpeg" || ext == "png";
}

std::string parent_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

std::string join_names(const std::vector<std::string>& names, size_t max = 12) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < max; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > max) out += fmt::format(", ... ({} in all)", names.size());
  return out.empty() ? std::string("nothing") : out;
}

struct Item {
  const TreeFile* file;
  uint8_t label;
};

struct Split {
  std::string dir;  // "train", "cifar-10-jpeg/test", ...
  std::vector<std::string> classes;
  std::vector<Item> items;
  int64_t ignored = 0;
  std::string ignored_example;
};

// Where the user will find the file: the path on disk, or the member and the archive.
std::string describe_file(const FileTree& tree, const TreeFile& f) {
  return tree.archive ? fmt::format("{} (member of archive {})", f.path, tree.root) : f.disk_path;
}

Split list_split(const FileTree& tree, const std::string& dir) {
  Split s;
  s.dir = dir;
  const std::string prefix = dir + "/";
  for (const auto& d : tree.dirs) {
    if (d.rfind(prefix, 0) == 0 && d.find('/', prefix.size()) == std::string::npos) {
      s.classes.push_back(d.substr(prefix.size()));
    }
  }
  std::sort(s.classes.begin(), s.classes.end());
  if (s.classes.empty()) {
    throw UsageError(
        fmt::format("{}/ in --data_dir={} has no class sub-folders; {}", dir, tree.root, kLayout));
  }
  if (s.classes.size() > 256) {
    throw UsageError(
        fmt::format("{}/ in --data_dir={} has {} class folders; dtrain stores labels in "
                    "one byte and supports at most 256 classes",
                    dir, tree.root, s.classes.size()));
  }
  std::map<std::string, uint8_t> label;
  for (size_t i = 0; i < s.classes.size(); ++i) label[s.classes[i]] = static_cast<uint8_t>(i);
  std::vector<int64_t> per_class(s.classes.size(), 0), others(s.classes.size(), 0);
  for (const auto& f : tree.files) {
    if (f.path.rfind(prefix, 0) != 0) continue;
    const auto slash = f.path.find('/', prefix.size());
    const bool image = is_image_name(f.path);
    if (slash == std::string::npos || !image) {  // beside the class folders, or not an image
      if (s.ignored++ == 0) s.ignored_example = f.path;
      if (slash != std::string::npos)
        ++others[label.at(f.path.substr(prefix.size(), slash - prefix.size()))];
      continue;
    }
    const uint8_t l = label.at(f.path.substr(prefix.size(), slash - prefix.size()));
    s.items.push_back({&f, l});
    ++per_class[l];
  }
  for (size_t i = 0; i < s.classes.size(); ++i) {
    if (per_class[i] == 0) {
      throw UsageError(
          fmt::format("class folder {}/{} in --data_dir={} holds no .jpg, .jpeg or .png "
                      "image ({} other files); every class needs images (torchvision "
                      "refuses this too): add them or remove the folder",
                      dir, s.classes[i], tree.root, others[i]));
    }
  }
  // torchvision's order: by class, then folder by folder (sorted), files sorted within each.
  std::stable_sort(s.items.begin(), s.items.end(), [](const Item& a, const Item& b) {
    if (a.label != b.label) return a.label < b.label;
    const std::string pa = parent_of(a.file->path), pb = parent_of(b.file->path);
    if (pa != pb) return pa < pb;
    return a.file->path < b.file->path;
  });
  return s;
}

// Decodes every image of a split on `threads` threads into planar CHW uint8.
ImageDataset decode_split(const FileTree& tree, const Split& split, const std::string& name,
                          const ImageFolderOptions& options) {
  const size_t n = split.items.size();
  auto bytes_of = [&](const TreeFile& f, std::vector<uint8_t>& buf) -> const std::vector<uint8_t>& {
    if (!tree.archive) {
      buf = read_whole_file(f.disk_path);
      return buf;
    }
    return f.bytes;
  };
  // The first image that decodes fixes the size every other one must have.
  ImageDecoder first_decoder;
  DecodedImage first;
  std::vector<std::string> errors(n);
  size_t first_good = 0;
  for (std::vector<uint8_t> buf; first_good < n; ++first_good) {
    const auto& b = bytes_of(*split.items[first_good].file, buf);
    if (first_decoder.decode(b.data(), b.size(), first, errors[first_good])) break;
    if (!options.skip_bad_images) break;
  }
  auto bad_image = [&](size_t i) {
    return DataError(
        fmt::format("cannot decode image {}: {}; replace or remove the file, or pass "
                    "--skip_bad_images to train without it",
                    describe_file(tree, *split.items[i].file), errors[i]));
  };
  if (first_good < n && !errors[first_good].empty()) throw bad_image(first_good);
  ImageDataset ds;
  ds.name = name;
  ds.channels = 3;
  ds.height = first.height;
  ds.width = first.width;
  ds.classes = split.classes;
  ds.num_classes = static_cast<int64_t>(split.classes.size());
  ds.ignored_files = split.ignored;
  ds.ignored_example = split.ignored_example;
  std::vector<char> ok(n, 0);
  std::atomic<size_t> mismatch{n};  // lowest index of an image of another size
  std::atomic<bool> stop{false};
  // With --image_size, images of another size than the first wait here (planar CHW) until the
  // split is put together in its resampled layout.
  const bool any_size = options.image_size > 0;
  std::vector<std::vector<uint8_t>> odd(any_size ? n : 0);
  std::vector<StoredImage> sizes(any_size ? n : 0);
  std::atomic<bool> sizes_differ{false};
  // Over options.max_decoded_bytes the decode pass still checks every image and measures the
  // statistics, but keeps no pixels: the split keeps the encoded bytes instead (decodes per
  // epoch). A split of one size knows its decoded size from the first image; mixed sizes add up
  // as they decode.
  const int64_t limit = options.max_decoded_bytes;
  const int64_t first_elems = ds.image_elems();
  std::atomic<bool> over_limit{limit > 0 && static_cast<int64_t>(n) * first_elems > limit};
  std::atomic<int64_t> odd_bytes{0};
  int threads = 1;
  std::mutex sums_mu;
  std::array<double, 3> sum{}, sum_sq{};
  double pixel_count = 0;
  if (first_good < n) {
    const int64_t elems = first_elems;
    if (!over_limit) ds.pixels.resize(n * static_cast<size_t>(elems));
    std::atomic<size_t> next{first_good};
    auto work = [&] {
      ImageDecoder decoder;
      DecodedImage img;
      std::vector<uint8_t> buf, not_kept;
      std::array<uint64_t, 3> s{}, sq{};
      uint64_t pixels_seen = 0;
      for (size_t i; !stop.load(std::memory_order_relaxed) && (i = next.fetch_add(1)) < n;) {
        try {
          const auto& b = bytes_of(*split.items[i].file, buf);
          if (!decoder.decode(b.data(), b.size(), img, errors[i])) {
            if (!options.skip_bad_images) stop = true;
            continue;
          }
        } catch (const std::exception& e) {  // a file that cannot be read: as bad as a corrupt one
          errors[i] = e.what();
          if (!options.skip_bad_images) stop = true;
          continue;
        }
        uint8_t* out = nullptr;
        const bool same = img.width == ds.width && img.height == ds.height;
        const int64_t bytes = int64_t{3} * img.width * img.height;
        if (!same && !any_size) {
          for (size_t m = mismatch.load(); i < m && !mismatch.compare_exchange_weak(m, i);) {
          }
          stop = true;
          continue;
        }
        if (!same) sizes_differ = true;
        if (!same && !over_limit && limit > 0 &&
            static_cast<int64_t>(n) * elems + odd_bytes.fetch_add(bytes) + bytes > limit) {
          over_limit = true;
        }
        if (over_limit) {
          not_kept.resize(static_cast<size_t>(bytes));
          out = not_kept.data();
        } else if (same) {
          out = ds.pixels.data() + i * elems;
        } else {
          odd[i].resize(static_cast<size_t>(bytes));
          out = odd[i].data();
        }
        if (any_size) sizes[i] = {0, static_cast<int32_t>(img.height), static_cast<int32_t>(img.width)};
        const int64_t plane = static_cast<int64_t>(img.height) * img.width;
        pixels_seen += static_cast<uint64_t>(plane);
        for (int c = 0; c < 3; ++c) {
          uint8_t* dst = out + c * plane;
          const uint8_t* src = img.rgb.data() + c;
          for (int64_t p = 0; p < plane; ++p) dst[p] = src[3 * p];
          // 32-bit sums over blocks small enough not to overflow (255^2 * 65536 < 2^32) let the
          // compiler vectorise this pass; it was a sixth of the load time as one strided loop.
          for (int64_t b = 0; b < plane; b += 65536) {
            uint32_t bs = 0, bsq = 0;
            for (int64_t p = b, e = std::min<int64_t>(plane, b + 65536); p < e; ++p) {
              const uint32_t v = dst[p];
              bs += v;
              bsq += v * v;
            }
            s[c] += bs;
            sq[c] += bsq;
          }
        }
        ok[i] = 1;
      }
      std::lock_guard<std::mutex> lock(sums_mu);
      pixel_count += static_cast<double>(pixels_seen);
      for (int c = 0; c < 3; ++c) {
        sum[c] += static_cast<double>(s[c]);
        sum_sq[c] += static_cast<double>(sq[c]);
      }
    };
    threads = options.threads > 0 ? options.threads
                                      : static_cast<int>(std::thread::hardware_concurrency());
    threads = std::max(1, std::min<int>(threads, static_cast<int>(n - first_good)));
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
  }
  if (mismatch < n) {
    const TreeFile& a = *split.items[first_good].file;
    const TreeFile& b = *split.items[mismatch].file;
    DecodedImage other;
    std::string ignored;
    std::vector<uint8_t> buf;
    const auto& bytes = bytes_of(b, buf);
    first_decoder.decode(bytes.data(), bytes.size(), other, ignored);
    throw UsageError(fmt::format(
        "images in --data_dir={} differ in size: {} is {}x{} but {} is {}x{}; pass --image_size "
        "S to train on S x S crops of them (torchvision's RandomResizedCrop for training, Resize "
        "+ CenterCrop for testing), for example --image_size 224",
        tree.root, a.path, ds.width, ds.height, b.path, other.width, other.height));
  }
  for (size_t i = 0; i < n; ++i) {
    if (errors[i].empty()) continue;
    if (!options.skip_bad_images) throw bad_image(i);
    ds.skipped_bad_images.push_back(fmt::format("{} ({})", split.items[i].file->path, errors[i]));
  }
  // Keep the images that decoded, in order: at one size (the first's), or, when --image_size
  // asks for another size or they differ, each at its own (ImageDataset::stored).
  const bool resample = any_size && (sizes_differ || ds.height != options.image_size ||
                                     ds.width != options.image_size);
  const bool per_epoch = over_limit;
  if (per_epoch) {
    std::vector<uint8_t>().swap(ds.pixels);
    std::vector<std::vector<uint8_t>>().swap(odd);
    ds.encoded_offsets.push_back(0);
    std::vector<uint8_t> buf;
    for (size_t i = 0; i < n; ++i) {
      if (!ok[i]) continue;
      const auto& b = bytes_of(*split.items[i].file, buf);
      ds.encoded.insert(ds.encoded.end(), b.begin(), b.end());
      ds.encoded_offsets.push_back(static_cast<int64_t>(ds.encoded.size()));
    }
    ds.decode_threads = threads;
  }
  size_t kept = 0;
  const size_t elems = static_cast<size_t>(ds.image_elems());
  if (resample && per_epoch) {
    for (size_t i = 0; i < n; ++i)
      if (ok[i]) ds.stored.push_back(sizes[i]);  // sizes only: the pixels are decoded per epoch
    ds.height = ds.width = options.image_size;
  } else if (resample) {
    std::vector<uint8_t> packed;
    size_t bytes = 0;
    for (size_t i = 0; i < n; ++i)
      if (ok[i]) bytes += 3 * static_cast<size_t>(sizes[i].height) * sizes[i].width;
    packed.reserve(bytes);
    for (size_t i = 0; i < n; ++i) {
      if (!ok[i]) continue;
      sizes[i].offset = static_cast<int64_t>(packed.size());
      if (odd[i].empty()) {
        packed.insert(packed.end(), ds.pixels.begin() + i * elems, ds.pixels.begin() + (i + 1) * elems);
      } else {
        packed.insert(packed.end(), odd[i].begin(), odd[i].end());
        std::vector<uint8_t>().swap(odd[i]);
      }
      ds.stored.push_back(sizes[i]);
    }
    ds.pixels = std::move(packed);
    ds.height = ds.width = options.image_size;
  }
  for (size_t i = 0; i < n; ++i) {
    if (!ok[i]) continue;
    if (!resample && !per_epoch && kept != i)
      std::copy_n(ds.pixels.begin() + i * elems, elems, ds.pixels.begin() + kept * elems);
    ds.labels.push_back(split.items[i].label);
    ds.sources.push_back(split.items[i].file->path);
    ++kept;
  }
  if (!resample && !per_epoch) ds.pixels.resize(kept * elems);
  if (kept == 0) {
    throw DataError(
        fmt::format("no image of {}/ in --data_dir={} decodes ({} skipped as bad, the "
                    "first: {}); check the files",
                    split.dir, tree.root, ds.skipped_bad_images.size(),
                    ds.skipped_bad_images.empty() ? "-" : ds.skipped_bad_images[0]));
  }
  const double count = pixel_count;
  for (int c = 0; c < 3; ++c) {
    const double mean = sum[c] / count / 255.0;
    const double var = std::max(0.0, sum_sq[c] / count / (255.0 * 255.0) - mean * mean);
    ds.mean.push_back(static_cast<float>(mean));
    // A constant channel (a synthetic test set, say) must not divide by zero.
    ds.stddev.push_back(static_cast<float>(std::max(std::sqrt(var), 1e-3)));
  }
  return ds;
}

}  // namespace

DatasetSplits load_image_folder(const std::string& path, const ImageFolderOptions& options) {
  const FileTree tree = read_file_tree(path, is_image_name);
  // The split folders: at the top, or inside the one top-level folder (cifar-10-jpeg/train/...).
  std::string base;
  if (tree.dirs.count("train") == 0) {
    std::vector<std::string> top;
    for (const auto& d : tree.dirs) {
      if (d.find('/') == std::string::npos) top.push_back(d);
    }
    if (top.size() == 1 && tree.dirs.count(top[0] + "/train")) {
      base = top[0] + "/";
    } else {
      throw UsageError(fmt::format("--data_dir={} has no train/ folder (found at the top: {}); {}",
                                   path, join_names(top), kLayout));
    }
  }
  std::string test_dir = base + "test";
  if (tree.dirs.count(test_dir) == 0) test_dir = base + "val";
  if (tree.dirs.count(test_dir) == 0) {
    throw UsageError(
        fmt::format("--data_dir={} has {}train/ but no {}test/ or {}val/ beside it; {}", path, base,
                    base, base, kLayout));
  }
  const Split train = list_split(tree, base + "train");
  const Split test = list_split(tree, test_dir);
  if (train.classes != test.classes) {
    throw UsageError(fmt::format(
        "--data_dir={}: {}/ has the classes {} but {}/ has {}; both need "
        "the same class folders (the labels are their sorted index)",
        path, train.dir, join_names(train.classes), test.dir, join_names(test.classes)));
  }
  DatasetSplits out;
  out.train = decode_split(tree, train, "imagefolder-train", options);
  out.test = decode_split(tree, test, "imagefolder-test", options);
  if (out.train.height != out.test.height || out.train.width != out.test.width) {
    throw UsageError(
        fmt::format("--data_dir={}: the images of {}/ are {}x{} but those of {}/ are "
                    "{}x{} ({}); pass --image_size S to train and test on S x S crops",
                    path, train.dir, out.train.width, out.train.height, test.dir, out.test.width,
                    out.test.height, out.test.sources.front()));
  }
  // The test set is normalised with the training set's statistics, as a trained model is used.
  out.test.mean = out.train.mean;
  out.test.stddev = out.train.stddev;
  return out;
}

std::vector<std::string> describe_image_folder(const DatasetSplits& splits) {
  std::vector<std::string> lines;
  const auto& classes = splits.train.classes;
  lines.push_back(fmt::format("{} classes: {}", classes.size(), join_names(classes, 1000)));
  for (const ImageDataset* ds : {&splits.train, &splits.test}) {
    std::vector<int64_t> count(classes.size(), 0);
    for (uint8_t l : ds->labels) ++count[l];
    std::string per_class;
    for (size_t i = 0; i < classes.size(); ++i) {
      per_class += fmt::format("{}{} {}", i ? ", " : "", classes[i], count[i]);
    }
    std::string line = fmt::format("{}: {} images ({})", ds->name, ds->size(), per_class);
    if (ds->ignored_files > 0) {
      line += fmt::format(
          "; ignored {} file(s) that are not .jpg/.jpeg/.png or lie outside the "
          "class folders (e.g. {})",
          ds->ignored_files, ds->ignored_example);
    }
    if (!ds->skipped_bad_images.empty()) {
      line += fmt::format("; skipped {} bad image(s) (--skip_bad_images), e.g. {}",
                          ds->skipped_bad_images.size(), ds->skipped_bad_images.front());
    }
    lines.push_back(line);
  }
  return lines;
}

}  // namespace dlaunch::data
