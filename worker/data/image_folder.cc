// torchvision's ImageFolder layout from a directory or a tar archive (see dataset.h).
#include <fmt/format.h>

#include <algorithm>
#include <array>
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
    const bool image = is_image_name(f.path) && !f.unread_link;
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

// Per-channel sums of pixel values (0..255), for a split's mean and standard deviation: exact
// integers per decode thread, added up in double across threads.
template <typename T>
struct ChannelSums {
  std::array<T, 3> sum{}, sum_sq{};
  T pixels = 0;
};

// Copies an interleaved RGB image into planar CHW at `out` and adds its values to `sums`.
void to_planar_counting(const DecodedImage& img, uint8_t* out, ChannelSums<uint64_t>& sums) {
  const int64_t plane = static_cast<int64_t>(img.height) * img.width;
  sums.pixels += static_cast<uint64_t>(plane);
  for (int c = 0; c < 3; ++c) {
    uint8_t* dst = out + c * plane;
    const uint8_t* src = img.rgb.data() + c;
    for (int64_t p = 0; p < plane; ++p) dst[p] = src[3 * p];
    // 32-bit sums over blocks small enough not to overflow (255^2 * 65536 < 2^32) let the
    // compiler vectorise this pass, which runs over every pixel of every image loaded.
    for (int64_t b = 0; b < plane; b += 65536) {
      uint32_t bs = 0, bsq = 0;
      for (int64_t p = b, e = std::min<int64_t>(plane, b + 65536); p < e; ++p) {
        const uint32_t v = dst[p];
        bs += v;
        bsq += v * v;
      }
      sums.sum[c] += bs;
      sums.sum_sq[c] += bsq;
    }
  }
}

// Decodes every image of a split on `threads` threads into planar CHW uint8: run() takes the
// steps in order; the members are what the steps share.
class SplitDecoder {
 public:
  // `bad` collects the images that do not decode, with the reason (in the order of the split).
  SplitDecoder(const FileTree& tree, const Split& split, const std::string& name,
               const ImageFolderOptions& options, std::vector<std::string>* bad)
      : tree_(tree),
        split_(split),
        options_(options),
        bad_(bad),
        n_(split.items.size()),
        any_size_(options.image_size > 0),
        limit_(options.max_decoded_bytes),
        errors_(n_),
        ok_(n_, 0),
        mismatch_(n_),
        odd_(any_size_ ? n_ : 0),
        sizes_(any_size_ ? n_ : 0) {
    ds_.name = name;
  }

  ImageDataset run() {
    decode_first();
    if (first_good_ < n_) decode_all();
    throw_if_sizes_differ();
    collect_bad_images();
    // Without --skip_bad_images the caller refuses the set, naming the bad images of both splits.
    if (!options_.skip_bad_images && !ds_.skipped_bad_images.empty()) return {};
    // Keep the images that decoded, in order: at one size (the first's), or, when --image_size
    // asks for another size or they differ, each at its own (ImageDataset::stored).
    resample_ = any_size_ && (sizes_differ_ || ds_.height != options_.image_size ||
                              ds_.width != options_.image_size);
    per_epoch_ = over_limit_;
    if (per_epoch_) keep_encoded();
    if (resample_ && per_epoch_) {
      for (size_t i = 0; i < n_; ++i)
        if (ok_[i]) ds_.stored.push_back(sizes_[i]);  // sizes only: decoded per epoch
      ds_.height = ds_.width = options_.image_size;
    } else if (resample_) {
      pack_resampled();
    }
    keep_decoded();
    set_statistics();
    return std::move(ds_);
  }

 private:
  const std::vector<uint8_t>& bytes_of(const TreeFile& f, std::vector<uint8_t>& buf) const {
    if (!tree_.archive) {
      buf = read_whole_file(f.disk_path);
      return buf;
    }
    return f.bytes;
  }

  // The first image that decodes fixes the size every other one must have.
  void decode_first() {
    DecodedImage first;
    for (std::vector<uint8_t> buf; first_good_ < n_; ++first_good_) {
      try {
        const auto& b = bytes_of(*split_.items[first_good_].file, buf);
        if (first_decoder_.decode(b.data(), b.size(), first, errors_[first_good_])) break;
      } catch (const std::exception& e) {  // unreadable: as bad as a corrupt one
        errors_[first_good_] = e.what();
      }
    }
    ds_.channels = 3;
    ds_.height = first.height;
    ds_.width = first.width;
    ds_.classes = split_.classes;
    ds_.num_classes = static_cast<int64_t>(split_.classes.size());
    ds_.ignored_files = split_.ignored;
    ds_.ignored_example = split_.ignored_example;
    // Over options.max_decoded_bytes the decode pass still checks every image and measures the
    // statistics, but keeps no pixels: the split keeps the encoded bytes instead (decodes per
    // epoch). A split of one size knows its decoded size from the first image; mixed sizes add
    // up as they decode.
    first_elems_ = ds_.image_elems();
    over_limit_ = limit_ > 0 && static_cast<int64_t>(n_) * first_elems_ > limit_;
  }

  void decode_all() {
    if (!over_limit_) ds_.pixels.resize(n_ * static_cast<size_t>(first_elems_));
    next_ = first_good_;
    threads_ = options_.threads > 0 ? options_.threads
                                    : static_cast<int>(std::thread::hardware_concurrency());
    threads_ = std::max(1, std::min<int>(threads_, static_cast<int>(n_ - first_good_)));
    std::vector<std::thread> pool;
    for (int t = 1; t < threads_; ++t) pool.emplace_back([this] { decode_worker(); });
    decode_worker();
    for (auto& t : pool) t.join();
  }

  void decode_worker() {
    ImageDecoder decoder;
    DecodedImage img;
    std::vector<uint8_t> buf, not_kept;
    ChannelSums<uint64_t> local;
    for (size_t i; !stop_.load(std::memory_order_relaxed) && (i = next_.fetch_add(1)) < n_;) {
      if (!decode_one(decoder, i, img, buf)) continue;
      uint8_t* out = destination(i, img, not_kept);
      if (out == nullptr) continue;
      if (any_size_) sizes_[i] = {0, static_cast<int32_t>(img.height), static_cast<int32_t>(img.width)};
      to_planar_counting(img, out, local);
      ok_[i] = 1;
    }
    std::lock_guard<std::mutex> lock(sums_mu_);
    sums_.pixels += static_cast<double>(local.pixels);
    for (int c = 0; c < 3; ++c) {
      sums_.sum[c] += static_cast<double>(local.sum[c]);
      sums_.sum_sq[c] += static_cast<double>(local.sum_sq[c]);
    }
  }

  // False when image i does not decode (its error recorded). The pass goes on either way, so
  // that one error can name every bad image (or they are all skipped).
  bool decode_one(ImageDecoder& decoder, size_t i, DecodedImage& img, std::vector<uint8_t>& buf) {
    try {
      const auto& b = bytes_of(*split_.items[i].file, buf);
      if (decoder.decode(b.data(), b.size(), img, errors_[i])) return true;
    } catch (const std::exception& e) {  // a file that cannot be read: as bad as a corrupt one
      errors_[i] = e.what();
    }
    return false;
  }

  // Where image i's planar pixels go: its slot in the split, a buffer of its own (another size,
  // kept for resampling), or a scratch buffer (over the limit: nothing kept). nullptr: another
  // size without --image_size, which stops the pass.
  uint8_t* destination(size_t i, const DecodedImage& img, std::vector<uint8_t>& not_kept) {
    const bool same = img.width == ds_.width && img.height == ds_.height;
    const int64_t bytes = int64_t{3} * img.width * img.height;
    if (!same && !any_size_) {
      for (size_t m = mismatch_.load(); i < m && !mismatch_.compare_exchange_weak(m, i);) {
      }
      stop_ = true;
      return nullptr;
    }
    if (!same) sizes_differ_ = true;
    if (!same && !over_limit_ && limit_ > 0 &&
        static_cast<int64_t>(n_) * first_elems_ + odd_bytes_.fetch_add(bytes) + bytes > limit_) {
      over_limit_ = true;
    }
    if (over_limit_) {
      not_kept.resize(static_cast<size_t>(bytes));
      return not_kept.data();
    }
    if (same) return ds_.pixels.data() + i * first_elems_;
    odd_[i].resize(static_cast<size_t>(bytes));
    return odd_[i].data();
  }

  void throw_if_sizes_differ() {
    if (mismatch_ >= n_) return;
    const TreeFile& a = *split_.items[first_good_].file;
    const TreeFile& b = *split_.items[mismatch_].file;
    DecodedImage other;
    std::string ignored;
    std::vector<uint8_t> buf;
    const auto& bytes = bytes_of(b, buf);
    first_decoder_.decode(bytes.data(), bytes.size(), other, ignored);
    throw UsageError(fmt::format(
        "images in --data_dir={} differ in size: {} is {}x{} but {} is {}x{}; pass --image_size "
        "S to train on S x S crops of them (torchvision's RandomResizedCrop for training, Resize "
        "+ CenterCrop for testing), for example --image_size 224",
        tree_.root, a.path, ds_.width, ds_.height, b.path, other.width, other.height));
  }

  void collect_bad_images() {
    for (size_t i = 0; i < n_; ++i) {
      if (errors_[i].empty()) continue;
      const TreeFile& f = *split_.items[i].file;
      // Where the user will find it: the member (the message names the archive), or the file.
      bad_->push_back(fmt::format("{}: {}", tree_.archive ? f.path : f.disk_path, errors_[i]));
      ds_.skipped_bad_images.push_back(fmt::format("{} ({})", f.path, errors_[i]));
    }
  }

  // Over the limit: the split keeps the encoded bytes of the images that decoded.
  void keep_encoded() {
    std::vector<uint8_t>().swap(ds_.pixels);
    std::vector<std::vector<uint8_t>>().swap(odd_);
    ds_.encoded_offsets.push_back(0);
    std::vector<uint8_t> buf;
    for (size_t i = 0; i < n_; ++i) {
      if (!ok_[i]) continue;
      const auto& b = bytes_of(*split_.items[i].file, buf);
      ds_.encoded.insert(ds_.encoded.end(), b.begin(), b.end());
      ds_.encoded_offsets.push_back(static_cast<int64_t>(ds_.encoded.size()));
    }
    ds_.decode_threads = threads_;
  }

  // Each image at its own size, back to back (ImageDataset::stored says where).
  void pack_resampled() {
    const size_t elems = static_cast<size_t>(ds_.image_elems());
    std::vector<uint8_t> packed;
    size_t bytes = 0;
    for (size_t i = 0; i < n_; ++i)
      if (ok_[i]) bytes += 3 * static_cast<size_t>(sizes_[i].height) * sizes_[i].width;
    packed.reserve(bytes);
    for (size_t i = 0; i < n_; ++i) {
      if (!ok_[i]) continue;
      sizes_[i].offset = static_cast<int64_t>(packed.size());
      if (odd_[i].empty()) {
        packed.insert(packed.end(), ds_.pixels.begin() + i * elems,
                      ds_.pixels.begin() + (i + 1) * elems);
      } else {
        packed.insert(packed.end(), odd_[i].begin(), odd_[i].end());
        std::vector<uint8_t>().swap(odd_[i]);
      }
      ds_.stored.push_back(sizes_[i]);
    }
    ds_.pixels = std::move(packed);
    ds_.height = ds_.width = options_.image_size;
  }

  // Labels and sources of the images that decoded; at one size, their pixels closed up.
  void keep_decoded() {
    const bool compact = !resample_ && !per_epoch_;
    const size_t elems = static_cast<size_t>(ds_.image_elems());
    size_t kept = 0;
    for (size_t i = 0; i < n_; ++i) {
      if (!ok_[i]) continue;
      if (compact && kept != i)
        std::copy_n(ds_.pixels.begin() + i * elems, elems, ds_.pixels.begin() + kept * elems);
      ds_.labels.push_back(split_.items[i].label);
      ds_.sources.push_back(split_.items[i].file->path);
      ++kept;
    }
    if (compact) ds_.pixels.resize(kept * elems);
    if (kept == 0) {
      throw DataError(
          fmt::format("no image of {}/ in --data_dir={} decodes ({} skipped as bad, the "
                      "first: {}); check the files",
                      split_.dir, tree_.root, ds_.skipped_bad_images.size(),
                      ds_.skipped_bad_images.empty() ? "-" : ds_.skipped_bad_images[0]));
    }
  }

  void set_statistics() {
    for (int c = 0; c < 3; ++c) {
      const double mean = sums_.sum[c] / sums_.pixels / 255.0;
      const double var =
          std::max(0.0, sums_.sum_sq[c] / sums_.pixels / (255.0 * 255.0) - mean * mean);
      ds_.mean.push_back(static_cast<float>(mean));
      // A constant channel (a synthetic test set, say) must not divide by zero.
      ds_.stddev.push_back(static_cast<float>(std::max(std::sqrt(var), 1e-3)));
    }
  }

  const FileTree& tree_;
  const Split& split_;
  const ImageFolderOptions& options_;
  std::vector<std::string>* bad_;
  const size_t n_;
  // With --image_size, images of another size than the first wait in odd_ (planar CHW) until
  // the split is put together in its resampled layout.
  const bool any_size_;
  const int64_t limit_;
  ImageDataset ds_;
  ImageDecoder first_decoder_;
  size_t first_good_ = 0;
  int64_t first_elems_ = 0;
  int threads_ = 1;
  std::vector<std::string> errors_;
  std::vector<char> ok_;
  std::atomic<size_t> next_{0};
  std::atomic<size_t> mismatch_;  // lowest index of an image of another size
  std::atomic<bool> stop_{false};
  std::vector<std::vector<uint8_t>> odd_;
  std::vector<StoredImage> sizes_;
  std::atomic<bool> sizes_differ_{false};
  std::atomic<bool> over_limit_{false};
  std::atomic<int64_t> odd_bytes_{0};
  std::mutex sums_mu_;
  ChannelSums<double> sums_;
  bool resample_ = false, per_epoch_ = false;
};

ImageDataset decode_split(const FileTree& tree, const Split& split, const std::string& name,
                          const ImageFolderOptions& options, std::vector<std::string>* bad) {
  return SplitDecoder(tree, split, name, options, bad).run();
}

// The bad images listed in a refusal: enough to start on, and the count says how many more.
constexpr size_t kBadImagesNamed = 10;

// Without --skip_bad_images: one error for every image of both splits that does not decode.
void refuse_bad_images(const FileTree& tree, const std::vector<std::string>& bad) {
  std::string list;
  for (size_t i = 0; i < bad.size() && i < kBadImagesNamed; ++i) list += (i ? "; " : "") + bad[i];
  if (bad.size() > kBadImagesNamed) list += fmt::format("; and {} more", bad.size() - kBadImagesNamed);
  throw DataError(fmt::format(
      "{} image(s) {} do not decode: {}. Replace or remove them, or pass --skip_bad_images to "
      "train without them (they are then named in the log and in metrics.jsonl)",
      bad.size(), tree.archive ? "in archive " + tree.root : "in --data_dir=" + tree.root, list));
}

// With --skip_bad_images: a class whose images were all skipped is refused, as an empty class
// folder is (the model would be trained with a class it never sees).
void refuse_classes_left_empty(const FileTree& tree, const Split& split, const ImageDataset& ds) {
  std::vector<int64_t> count(split.classes.size(), 0);
  for (uint8_t l : ds.labels) ++count[l];
  for (size_t c = 0; c < split.classes.size(); ++c) {
    if (count[c] > 0) continue;
    const std::string prefix = split.dir + "/" + split.classes[c] + "/";
    int64_t skipped = 0;
    std::string first;
    for (const std::string& s : ds.skipped_bad_images) {
      if (s.rfind(prefix, 0) != 0) continue;
      if (skipped++ == 0) first = s;
    }
    throw UsageError(fmt::format(
        "class folder {}/{} in --data_dir={} has no image that decodes: --skip_bad_images "
        "skipped all {} of them (the first: {}); every class needs images (torchvision refuses "
        "an empty class too): replace them or remove the folder",
        split.dir, split.classes[c], tree.root, skipped, first));
  }
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
  std::vector<std::string> bad;
  out.train = decode_split(tree, train, "imagefolder-train", options, &bad);
  out.test = decode_split(tree, test, "imagefolder-test", options, &bad);
  if (!options.skip_bad_images && !bad.empty()) refuse_bad_images(tree, bad);
  refuse_classes_left_empty(tree, train, out.train);
  refuse_classes_left_empty(tree, test, out.test);
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
