// Image folders (--dataset imagefolder): JPEG/PNG decoding against Pillow's pixels (made by
// pillow_images.py; skipped without python3-pil), the ImageFolder layout read from a directory
// and from tar archives the test writes (libarchive), every refusal, bad images stopping or
// skipped, and the full CIFAR-10 JPEG archive pixel for pixel against Pillow (skipped without
// ../shared/data).
#include <archive.h>
#include <archive_entry.h>
#include <gtest/gtest.h>
#include <turbojpeg.h>
#include <unistd.h>
#include <zlib.h>

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "worker/data/dataset.h"
#include "worker/data/batch_loader.h"
#include "worker/data/image_decode.h"
#include "worker/data/transforms.h"

namespace dlaunch::data {
namespace {
namespace fs = std::filesystem;

constexpr const char* kPython = "/usr/bin/python3";

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("dtrain_image_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

std::vector<uint8_t> slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_file(const fs::path& p, const std::vector<uint8_t>& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// A real JPEG (TurboJPEG, quality 90, 4:2:0) of a w x h pattern that depends on `seed`.
std::vector<uint8_t> make_jpeg(int w, int h, int seed) {
  std::vector<uint8_t> rgb(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      uint8_t* p = &rgb[(static_cast<size_t>(y) * w + x) * 3];
      p[0] = static_cast<uint8_t>(x * 255 / w);
      p[1] = static_cast<uint8_t>(y * 255 / h);
      p[2] = static_cast<uint8_t>(seed * 37);
    }
  }
  tjhandle tj = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  EXPECT_EQ(tjCompress2(tj, rgb.data(), w, 0, h, TJPF_RGB, &out, &size, TJSAMP_420, 90, 0), 0)
      << tjGetErrorStr2(tj);
  std::vector<uint8_t> jpeg(out, out + size);
  tjFree(out);
  tjDestroy(tj);
  return jpeg;
}

// A tar archive of `files` (name -> bytes) and the listed empty directories, gzipped or not.
void write_tar(const fs::path& path, const std::map<std::string, std::vector<uint8_t>>& files,
               bool gzip, const std::vector<std::string>& dirs = {}) {
  archive* a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  if (gzip) archive_write_add_filter_gzip(a);
  ASSERT_EQ(archive_write_open_filename(a, path.c_str()), ARCHIVE_OK) << archive_error_string(a);
  archive_entry* e = archive_entry_new();
  for (const auto& d : dirs) {
    archive_entry_clear(e);
    archive_entry_set_pathname(e, d.c_str());
    archive_entry_set_filetype(e, AE_IFDIR);
    archive_entry_set_perm(e, 0755);
    archive_write_header(a, e);
  }
  for (const auto& [name, bytes] : files) {
    archive_entry_clear(e);
    archive_entry_set_pathname(e, name.c_str());
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    archive_entry_set_size(e, static_cast<la_int64_t>(bytes.size()));
    archive_write_header(a, e);
    archive_write_data(a, bytes.data(), bytes.size());
  }
  archive_entry_free(e);
  archive_write_close(a);
  archive_write_free(a);
}

// train: cat 3 images (one in a nested folder, one .JPG), dog 2; test (or val): cat 1, dog 1;
// plus a README in train/ and a .txt in a class folder (ignored, counted).
std::map<std::string, std::vector<uint8_t>> small_folder(const std::string& top = "",
                                                         const std::string& test = "test",
                                                         int size = 16) {
  std::map<std::string, std::vector<uint8_t>> f;
  f[top + "train/cat/b.jpg"] = make_jpeg(size, size, 1);
  f[top + "train/cat/a.JPG"] = make_jpeg(size, size, 2);
  f[top + "train/cat/sub/c.jpeg"] = make_jpeg(size, size, 3);
  f[top + "train/cat/notes.txt"] = {'h', 'i'};
  f[top + "train/dog/x.jpg"] = make_jpeg(size, size, 4);
  f[top + "train/dog/y.jpg"] = make_jpeg(size, size, 5);
  f[top + "train/README"] = {'r'};
  f[top + test + "/cat/t.jpg"] = make_jpeg(size, size, 6);
  f[top + test + "/dog/u.jpg"] = make_jpeg(size, size, 7);
  return f;
}

void write_tree(const fs::path& root, const std::map<std::string, std::vector<uint8_t>>& files) {
  for (const auto& [name, bytes] : files) write_file(root / name, bytes);
}

bool have_pillow() {
  return std::system((std::string(kPython) + " -c 'import PIL' 2>/dev/null").c_str()) == 0;
}

template <typename E>
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "no exception";
}

// HWC RGB of image i (the dataset stores planar CHW).
std::vector<uint8_t> hwc(const ImageDataset& ds, int64_t i) {
  const int64_t plane = ds.height * ds.width;
  std::vector<uint8_t> out(plane * 3);
  const uint8_t* img = ds.image(i);
  for (int64_t p = 0; p < plane; ++p) {
    for (int c = 0; c < 3; ++c) out[p * 3 + c] = img[c * plane + p];
  }
  return out;
}

TEST(ImageDecodeTest, EveryColourTypeMatchesPillowsConvertRgb) {
  if (!have_pillow()) GTEST_SKIP() << "python3-pil is not importable by " << kPython;
  TempDir dir;
  const std::string cmd = std::string(kPython) + " " + PILLOW_SCRIPT + " make " +
                          dir.path().string() + " > " + (dir.path() / "list.txt").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream list(dir.path() / "list.txt");
  ImageDecoder decoder;
  int checked = 0;
  for (std::string name; std::getline(list, name);) {
    SCOPED_TRACE(name);
    const auto bytes = slurp(dir.path() / name);
    const auto want = slurp(dir.path() / (name + ".rgb"));
    DecodedImage img;
    std::string error;
    ASSERT_TRUE(decoder.decode(bytes.data(), bytes.size(), img, error)) << error;
    EXPECT_EQ(img.width, 37);
    EXPECT_EQ(img.height, 23);
    ASSERT_EQ(img.rgb.size(), want.size());
    size_t differ = 0;
    for (size_t i = 0; i < want.size(); ++i) differ += img.rgb[i] != want[i];
    EXPECT_EQ(differ, 0u) << "bytes differing from Pillow's";
    ++checked;
  }
  EXPECT_EQ(checked, 15);
}

TEST(ImageDecodeTest, TruncatedOrForeignBytesAreErrorsNotImages) {
  const auto jpeg = make_jpeg(32, 32, 1);
  ImageDecoder decoder;
  DecodedImage img;
  std::string error;
  ASSERT_TRUE(decoder.decode(jpeg.data(), jpeg.size(), img, error)) << error;
  const std::vector<uint8_t> cut(jpeg.begin(), jpeg.begin() + static_cast<long>(jpeg.size() / 2));
  EXPECT_FALSE(decoder.decode(cut.data(), cut.size(), img, error));
  EXPECT_NE(error.find("JPEG"), std::string::npos) << error;
  const std::vector<uint8_t> text = {'h', 'e', 'l', 'l', 'o'};
  EXPECT_FALSE(decoder.decode(text.data(), text.size(), img, error));
  EXPECT_NE(error.find("neither JPEG nor PNG"), std::string::npos) << error;
  const std::vector<uint8_t> png_head = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n', 0, 0, 0};
  EXPECT_FALSE(decoder.decode(png_head.data(), png_head.size(), img, error));
  EXPECT_NE(error.find("corrupt PNG"), std::string::npos) << error;
}

void expect_small_folder(const DatasetSplits& s) {
  EXPECT_EQ(s.train.classes, (std::vector<std::string>{"cat", "dog"}));
  EXPECT_EQ(s.test.classes, s.train.classes);
  EXPECT_EQ(s.train.num_classes, 2);
  ASSERT_EQ(s.train.size(), 5);
  ASSERT_EQ(s.test.size(), 2);
  EXPECT_EQ(s.train.channels, 3);
  EXPECT_EQ(s.train.height, 16);
  EXPECT_EQ(s.train.width, 16);
  // torchvision's order: class, then folder (sorted), then file name; "A" sorts before "b".
  std::vector<std::string> names;
  for (const auto& src : s.train.sources) names.push_back(fs::path(src).filename().string());
  EXPECT_EQ(names, (std::vector<std::string>{"a.JPG", "b.jpg", "c.jpeg", "x.jpg", "y.jpg"}));
  EXPECT_EQ(s.train.labels, (std::vector<uint8_t>{0, 0, 0, 1, 1}));
  EXPECT_EQ(s.test.labels, (std::vector<uint8_t>{0, 1}));
  EXPECT_EQ(s.train.ignored_files, 2);  // README beside the classes, notes.txt in one
  EXPECT_EQ(s.test.mean, s.train.mean);
  // Image a.JPG was made with seed 2: its blue channel is about 74 everywhere.
  const int64_t plane = 16 * 16;
  EXPECT_NEAR(s.train.image(0)[2 * plane + 100], 74, 3);
}

TEST(ImageFolderTest, DirectoryAndTarAndTarGzGiveTheSameDataset) {
  TempDir dir;
  write_tree(dir.path() / "folder", small_folder());
  write_tar(dir.path() / "data.tar", small_folder(), false);
  write_tar(dir.path() / "data.tgz", small_folder("set/", "val"), true);
  const DatasetSplits from_dir = load_image_folder((dir.path() / "folder").string(), {});
  expect_small_folder(from_dir);
  for (const char* name : {"data.tar", "data.tgz"}) {
    SCOPED_TRACE(name);
    const DatasetSplits s = load_image_folder((dir.path() / name).string(), {});
    expect_small_folder(s);
    EXPECT_EQ(s.train.pixels, from_dir.train.pixels);
    EXPECT_EQ(s.test.pixels, from_dir.test.pixels);
  }
  // A trailing slash on the directory changes nothing.
  EXPECT_EQ(load_image_folder((dir.path() / "folder").string() + "/", {}).train.sources,
            from_dir.train.sources);
  // One thread or many: the same bytes in the same places.
  ImageFolderOptions one;
  one.threads = 1;
  EXPECT_EQ(load_image_folder((dir.path() / "data.tar").string(), one).train.pixels,
            from_dir.train.pixels);
  const auto lines = describe_image_folder(from_dir);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "2 classes: cat, dog");
  EXPECT_NE(lines[1].find("imagefolder-train: 5 images (cat 3, dog 2); ignored 2 file(s)"),
            std::string::npos)
      << lines[1];
  // Through the --dataset dispatch too.
  EXPECT_EQ(load_dataset("imagefolder", (dir.path() / "folder").string(), false, 0).size(), 2);
}

TEST(ImageFolderTest, LayoutProblemsAreOneSentenceUsageErrors) {
  TempDir dir;
  auto refuse = [&](const std::string& name,
                    const std::map<std::string, std::vector<uint8_t>>& files,
                    const std::vector<std::string>& empty_dirs = {}) {
    write_tar(dir.path() / name, files, true, empty_dirs);
    return error_of<UsageError>([&] { load_image_folder((dir.path() / name).string(), {}); });
  };
  auto files = small_folder();
  auto no_test = files;
  for (auto it = no_test.begin(); it != no_test.end();)
    it = it->first.rfind("test/", 0) == 0 ? no_test.erase(it) : std::next(it);
  EXPECT_NE(refuse("no_test.tgz", no_test).find("has train/ but no test/ or val/"),
            std::string::npos);

  std::string e = refuse("empty_class.tgz", files, {"train/cow", "test/cow"});
  EXPECT_NE(e.find("class folder train/cow"), std::string::npos) << e;
  EXPECT_NE(e.find("holds no .jpg, .jpeg or .png image"), std::string::npos) << e;

  auto other_classes = files;
  other_classes["test/emu/e.jpg"] = make_jpeg(16, 16, 9);
  e = refuse("classes.tgz", other_classes);
  EXPECT_NE(e.find("train/ has the classes cat, dog but test/ has cat, dog, emu"),
            std::string::npos)
      << e;

  auto sizes = files;
  sizes["train/dog/z.jpg"] = make_jpeg(20, 16, 9);
  e = refuse("sizes.tgz", sizes);
  EXPECT_NE(e.find("differ in size: train/cat/a.JPG is 16x16 but train/dog/z.jpg is 20x16; "
                   "pass --image_size S"),
            std::string::npos)
      << e;

  e = refuse("no_train.tgz", {{"a/b.jpg", make_jpeg(8, 8, 1)}, {"c/d.jpg", make_jpeg(8, 8, 1)}});
  EXPECT_NE(e.find("has no train/ folder (found at the top: a, c)"), std::string::npos) << e;

  write_file(dir.path() / "not_tar.tar.gz", std::vector<uint8_t>(1000, 'x'));
  e = error_of<UsageError>(
      [&] { load_image_folder((dir.path() / "not_tar.tar.gz").string(), {}); });
  EXPECT_NE(e.find("is a file but not a tar archive"), std::string::npos) << e;
  // A zip file: an archive, but not tar.
  write_file(dir.path() / "data.zip",
             {'P', 'K', 3, 4, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  e = error_of<UsageError>([&] { load_image_folder((dir.path() / "data.zip").string(), {}); });
  EXPECT_NE(e.find("not a tar archive"), std::string::npos) << e;

  e = error_of<UsageError>([&] { load_image_folder((dir.path() / "missing").string(), {}); });
  EXPECT_NE(e.find("does not exist; expected a directory or a .tar, .tar.gz or .tgz archive"),
            std::string::npos)
      << e;
  e = error_of<UsageError>([&] { load_image_folder("/dev/null", {}); });
  EXPECT_NE(e.find("is neither a directory nor a file"), std::string::npos) << e;
}

TEST(ImageFolderTest, BadImageStopsNamingTheMemberUnlessSkipped) {
  TempDir dir;
  auto files = small_folder();
  auto& good = files["train/dog/y.jpg"];
  files["train/dog/y.jpg"] =
      std::vector<uint8_t>(good.begin(), good.begin() + static_cast<long>(good.size() / 2));
  files["test/cat/v.jpg"] = {'n', 'o', 't', ' ', 'a', ' ', 'j', 'p', 'e', 'g'};
  write_tar(dir.path() / "bad.tgz", files, true);
  const std::string archive = (dir.path() / "bad.tgz").string();
  // One error for both splits, each bad image with its reason.
  std::string e = error_of<DataError>([&] { load_image_folder(archive, {}); });
  EXPECT_NE(e.find("2 image(s) in archive " + archive + " do not decode: train/dog/y.jpg: corrupt "
                   "or truncated JPEG"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("; test/cat/v.jpg: neither JPEG nor PNG"), std::string::npos) << e;
  EXPECT_NE(e.find("--skip_bad_images"), std::string::npos) << e;

  write_tree(dir.path() / "folder", files);
  e = error_of<DataError>([&] { load_image_folder((dir.path() / "folder").string(), {}); });
  EXPECT_NE(e.find("do not decode: " + (dir.path() / "folder/train/dog/y.jpg").string() + ": "),
            std::string::npos)
      << e;
  EXPECT_NE(e.find((dir.path() / "folder/test/cat/v.jpg").string() + ": "), std::string::npos) << e;

  ImageFolderOptions skip;
  skip.skip_bad_images = true;
  const DatasetSplits s = load_image_folder(archive, skip);
  EXPECT_EQ(s.train.size(), 4);
  EXPECT_EQ(s.test.size(), 2);
  EXPECT_EQ(s.test.labels, (std::vector<uint8_t>{0, 1}));
  ASSERT_EQ(s.train.skipped_bad_images.size(), 1u);
  EXPECT_EQ(s.train.skipped_bad_images[0].rfind("train/dog/y.jpg (corrupt or truncated JPEG", 0),
            0u)
      << s.train.skipped_bad_images[0];
  ASSERT_EQ(s.test.skipped_bad_images.size(), 1u);
  EXPECT_NE(describe_image_folder(s)[1].find("skipped 1 bad image(s) (--skip_bad_images)"),
            std::string::npos);
  // The images kept are the good ones, moved up in order.
  const DatasetSplits clean = load_image_folder((dir.path() / "folder").string(), skip);
  EXPECT_EQ(clean.train.pixels, s.train.pixels);
}

// Issue 27: one run per bad image (each stopped at the first); --skip_bad_images leaving a class
// with no image trained on (only the info line said "bird 0").
TEST(ImageFolderTest, EveryBadImageIsCountedInOneErrorAndNoClassIsLeftEmpty) {
  TempDir dir;
  auto files = small_folder();
  for (int i = 0; i < 12; ++i) files[fmt::format("train/dog/bad{:02}.jpg", i)] = {'x', 'y', 'z'};
  write_tar(dir.path() / "many.tar", files, false);
  const std::string archive = (dir.path() / "many.tar").string();
  const std::string e = error_of<DataError>([&] { load_image_folder(archive, {}); });
  EXPECT_NE(e.find("12 image(s) in archive " + archive + " do not decode: train/dog/bad00.jpg: "),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("train/dog/bad09.jpg: "), std::string::npos) << e;
  EXPECT_EQ(e.find("bad10.jpg"), std::string::npos) << "more than 10 named: " << e;
  EXPECT_NE(e.find("; and 2 more."), std::string::npos) << e;

  ImageFolderOptions skip;
  skip.skip_bad_images = true;
  EXPECT_EQ(load_image_folder(archive, skip).train.size(), 5);
  // Every image of a class bad: refused as an empty class folder is, naming it.
  files["train/dog/x.jpg"] = {'n', 'o'};
  files["train/dog/y.jpg"] = {'n', 'o'};
  write_tar(dir.path() / "no_dog.tar", files, false);
  const std::string empty = error_of<UsageError>(
      [&] { load_image_folder((dir.path() / "no_dog.tar").string(), skip); });
  EXPECT_NE(empty.find("class folder train/dog in --data_dir=" + (dir.path() / "no_dog.tar").string() +
                       " has no image that decodes: --skip_bad_images skipped all 14 of them"),
            std::string::npos)
      << empty;
}

// A symlink leading nowhere in a folder and a symlink member in its tarball are both counted as
// ignored files (a link to an image in a folder is followed, as torchvision does).
TEST(ImageFolderTest, DanglingSymlinksAndArchiveSymlinksCountAsIgnored) {
  TempDir dir;
  const fs::path folder = dir.path() / "folder";
  write_tree(folder, small_folder());
  fs::create_symlink("missing.jpg", folder / "train/cat/gone.jpg");
  fs::create_symlink("x.jpg", folder / "train/dog/same.jpg");  // a good image, followed
  const DatasetSplits from_dir = load_image_folder(folder.string(), {});
  EXPECT_EQ(from_dir.train.size(), 6);
  EXPECT_EQ(from_dir.train.ignored_files, 3);  // README, notes.txt, gone.jpg

  // The same tree as a tarball: the dangling link is a symlink member (counted as ignored); the
  // good one is stored as its file.
  auto files = small_folder();
  files["train/dog/same.jpg"] = files["train/dog/x.jpg"];
  {  // write_tar's files plus one symlink member
    archive* a = archive_write_new();
    archive_write_set_format_pax_restricted(a);
    ASSERT_EQ(archive_write_open_filename(a, (dir.path() / "links.tar").c_str()), ARCHIVE_OK);
    archive_entry* e = archive_entry_new();
    for (const auto& [name, bytes] : files) {
      archive_entry_clear(e);
      archive_entry_set_pathname(e, name.c_str());
      archive_entry_set_filetype(e, AE_IFREG);
      archive_entry_set_perm(e, 0644);
      archive_entry_set_size(e, static_cast<la_int64_t>(bytes.size()));
      archive_write_header(a, e);
      archive_write_data(a, bytes.data(), bytes.size());
    }
    archive_entry_clear(e);
    archive_entry_set_pathname(e, "train/cat/gone.jpg");
    archive_entry_set_filetype(e, AE_IFLNK);
    archive_entry_set_symlink(e, "missing.jpg");
    archive_entry_set_perm(e, 0777);
    archive_write_header(a, e);
    archive_entry_free(e);
    archive_write_close(a);
    archive_write_free(a);
  }
  const DatasetSplits from_tar = load_image_folder((dir.path() / "links.tar").string(), {});
  EXPECT_EQ(from_tar.train.size(), from_dir.train.size());
  EXPECT_EQ(from_tar.train.ignored_files, from_dir.train.ignored_files);
  EXPECT_EQ(from_tar.train.pixels, from_dir.train.pixels);
}

TEST(ImageFolderTest, TruncatedArchiveNamesTheMember) {
  TempDir dir;
  auto files = small_folder();
  files["train/dog/big.jpg"] = make_jpeg(16, 16, 1);
  files["train/dog/big.jpg"].resize(200000, 0);  // larger than what survives the cut
  write_tar(dir.path() / "whole.tar", files, false);
  auto bytes = slurp(dir.path() / "whole.tar");
  bytes.resize(bytes.size() / 2);
  write_file(dir.path() / "cut.tar", bytes);
  const std::string e =
      error_of<DataError>([&] { load_image_folder((dir.path() / "cut.tar").string(), {}); });
  EXPECT_NE(e.find("train/dog/big.jpg"), std::string::npos) << e;
  EXPECT_NE(e.find("runcated"), std::string::npos) << e;  // libarchive: "Truncated tar archive"
}

// The real thing: all 60,000 CIFAR-10 JPEGs, decoded here and by Pillow, compared image by image.
TEST(ImageFolderTest, CifarJpegArchiveMatchesPillowPixelForPixel) {
  const fs::path archive = fs::path(DLAUNCH_TEST_DATA_DIR) / "cifar-10-jpeg.tar.gz";
  if (!fs::exists(archive)) GTEST_SKIP() << "no " << archive << " (see ../shared/data/README.md)";
  if (!have_pillow()) GTEST_SKIP() << "python3-pil is not importable by " << kPython;
  TempDir dir;
  const fs::path crcs = dir.path() / "pillow.txt";
  const std::string cmd =
      std::string(kPython) + " " + PILLOW_SCRIPT + " crc " + archive.string() + " " + crcs.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::map<std::string, uint32_t> pillow;
  std::ifstream in(crcs);
  for (std::string name; in >> name;) {
    int w = 0, h = 0;
    uint32_t crc = 0;
    in >> w >> h >> crc;
    ASSERT_EQ(w, 32);
    ASSERT_EQ(h, 32);
    pillow[name] = crc;
  }
  ASSERT_EQ(pillow.size(), 60000u);
  const DatasetSplits s = load_image_folder(archive.string(), {});
  ASSERT_EQ(s.train.size(), 50000);
  ASSERT_EQ(s.test.size(), 10000);
  EXPECT_EQ(s.train.classes,
            (std::vector<std::string>{"airplane", "automobile", "bird", "cat", "deer", "dog",
                                      "frog", "horse", "ship", "truck"}));
  int64_t compared = 0, differ = 0;
  std::string first_diff;
  for (const ImageDataset* ds : {&s.train, &s.test}) {
    for (int64_t i = 0; i < ds->size(); ++i) {
      const auto rgb = hwc(*ds, i);
      const uint32_t crc =
          static_cast<uint32_t>(crc32(0, rgb.data(), static_cast<uInt>(rgb.size())));
      const auto it = pillow.find(ds->sources[i]);  // the path inside the archive
      ASSERT_NE(it, pillow.end()) << ds->sources[i];
      ++compared;
      if (it->second != crc && differ++ == 0) first_diff = ds->sources[i];
      // The label is the class folder's index: cifar-10-jpeg/<split>/<class>/NNNN.jpg.
      EXPECT_EQ(ds->classes[ds->labels[i]],
                fs::path(ds->sources[i]).parent_path().filename().string());
    }
  }
  EXPECT_EQ(compared, 60000);
  EXPECT_EQ(differ, 0) << "images whose pixels differ from Pillow's; the first: " << first_diff;
}


// --image_size: images of several sizes (odd ones, much larger and smaller than S) through
// torchvision's test transform, Resize(int(S * 256 / 224)) + CenterCrop(S), and through the
// resize of a RandomResizedCrop box, against the same steps in Pillow 9.4 (pillow_images.py
// transform). Stated tolerance: at most 1 (of 255) per value, and we expect and check exactly 0
// differing values, since resize.cc follows Pillow's fixed-point arithmetic.
TEST(ImageResizeTest, ResizeCenterCropAndResizedCropMatchPillow) {
  if (!have_pillow()) GTEST_SKIP() << "python3-pil is not importable by " << kPython;
  TempDir dir;
  const std::vector<std::pair<int, int>> sizes = {{37, 23}, {64, 48}, {300, 200}, {20, 31},
                                                  {33, 33}, {100, 260}, {257, 255}};
  std::map<std::string, std::pair<int, int>> files;  // name -> (width, height)
  for (size_t k = 0; k < sizes.size(); ++k) {
    const auto [w, h] = sizes[k];
    const std::string name = "im" + std::to_string(w) + "x" + std::to_string(h) + ".jpg";
    const auto jpeg = make_jpeg(w, h, static_cast<int>(k) + 20);
    write_file(dir.path() / "tree" / "train" / (k % 2 ? "b" : "a") / name, jpeg);
    write_file(dir.path() / "flat" / name, jpeg);
    files[name] = {w, h};
  }
  write_file(dir.path() / "tree" / "test" / "a" / "t.jpg", make_jpeg(50, 70, 40));
  write_file(dir.path() / "tree" / "test" / "b" / "u.jpg", make_jpeg(70, 50, 41));
  int64_t compared = 0, differing = 0, worst = 0;
  for (const int64_t size : {16, 32, 64, 224}) {
    SCOPED_TRACE("--image_size " + std::to_string(size));
    const fs::path listing = dir.path() / ("boxes" + std::to_string(size) + ".txt");
    const std::string cmd = std::string(kPython) + " " + PILLOW_SCRIPT + " transform " +
                            (dir.path() / "flat").string() + " " + std::to_string(size) + " > " +
                            listing.string();
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    ImageFolderOptions options;
    options.image_size = size;
    const DatasetSplits s = load_image_folder((dir.path() / "tree").string(), options);
    ASSERT_TRUE(s.train.resampled());
    ASSERT_EQ(s.train.height, size);
    ASSERT_EQ(s.test.width, size);
    std::map<std::string, CropBox> boxes;
    std::ifstream in(listing);
    std::string name;
    for (CropBox b; in >> name >> b.top >> b.left >> b.height >> b.width;) boxes[name] = b;
    ASSERT_EQ(boxes.size(), files.size());
    std::vector<uint8_t> out(3 * size * size), scratch;
    for (int64_t i = 0; i < s.train.size(); ++i) {
      name = fs::path(s.train.sources[i]).filename().string();
      ASSERT_EQ(s.train.stored_width(i), files.at(name).first) << name;
      ASSERT_EQ(s.train.stored_height(i), files.at(name).second) << name;
      // Our planar CHW against Pillow's HWC.
      auto compare = [&](const char* what, const std::string& suffix) {
        const auto ref = slurp(dir.path() / "flat" / (name + suffix));
        ASSERT_EQ(ref.size(), out.size()) << what << " " << name;
        for (int64_t p = 0; p < size * size; ++p)
          for (int c = 0; c < 3; ++c) {
            const int d = std::abs(int(out[c * size * size + p]) - int(ref[p * 3 + c]));
            ASSERT_LE(d, 1) << what << " " << name << " pixel " << p << " channel " << c;
            worst = std::max<int64_t>(worst, d);
            differing += d != 0;
            ++compared;
          }
      };
      eval_pixels(s.train, i, size, out.data(), scratch);
      compare("Resize + CenterCrop", ".eval");
      resized_crop_pixels(s.train, i, boxes.at(name), size, out.data(), scratch);
      compare("resized crop", ".crop");
    }
  }
  EXPECT_EQ(compared, int64_t{2 * 3} * 7 * (16 * 16 + 32 * 32 + 64 * 64 + 224 * 224));
  EXPECT_EQ(differing, 0) << "of " << compared << " values, at most " << worst << " apart";
}

// torchvision's RandomResizedCrop.get_params semantics, seeded per (seed, epoch, sample).
TEST(ImageTransformsTest, RandomResizedCropDrawsTorchvisionsRanges) {
  bool flip = false;
  int64_t flips = 0, draws = 0;
  double area_sum = 0;
  for (const auto& [h, w] : std::vector<std::pair<int64_t, int64_t>>{{1000, 1000}, {200, 300},
                                                                       {31, 20}}) {
    for (int64_t index = 0; index < 4000; ++index) {
      const CropBox b = draw_resized_crop(5, index % 3, index, h, w, &flip);
      ASSERT_GE(b.top, 0);
      ASSERT_GE(b.left, 0);
      ASSERT_LE(b.top + b.height, h);
      ASSERT_LE(b.left + b.width, w);
      // Sides are rounded from the drawn area and ratio: allow half a pixel on each.
      const double ratio_hi = (b.width + 0.5) / (b.height - 0.5), ratio_lo = (b.width - 0.5) / (b.height + 0.5);
      EXPECT_TRUE(ratio_hi >= 3.0 / 4.0 && ratio_lo <= 4.0 / 3.0) << b.width << "x" << b.height;
      const double area = double(b.width) * b.height / double(h * w);
      EXPECT_GE((b.width + 0.5) * (b.height + 0.5) / double(h * w), 0.08);
      EXPECT_LE(area, 1.0);
      // A pure function of its arguments: any rank draws the same crop.
      bool again = false;
      const CropBox c = draw_resized_crop(5, index % 3, index, h, w, &again);
      EXPECT_TRUE(c.top == b.top && c.left == b.left && c.height == b.height &&
                  c.width == b.width && again == flip);
      if (h == 1000) {
        area_sum += area;
        flips += flip;
        ++draws;
      }
    }
  }
  // Area fraction ~ U(0.08, 1) (mean 0.54), but the large draws that do not fit a square at
  // their ratio are redrawn: torchvision's procedure gives a mean of 0.478 here (a simulation of
  // get_params in Python, 200,000 draws).
  EXPECT_NEAR(area_sum / draws, 0.478, 0.02);
  EXPECT_NEAR(double(flips) / draws, 0.5, 0.04);
  // Different epochs crop differently.
  bool ignored;
  int64_t same = 0;
  for (int64_t index = 0; index < 100; ++index) {
    const CropBox a = draw_resized_crop(5, 0, index, 500, 500, &ignored);
    const CropBox b = draw_resized_crop(5, 1, index, 500, 500, &ignored);
    same += a.top == b.top && a.left == b.left && a.height == b.height;
  }
  EXPECT_LT(same, 5);
  // No try fits a 1000x10 strip (every allowed crop of >= 8% of it is taller than 10 pixels): the
  // fallback is the centre, cut to the widest allowed ratio, h = 10, w = round(10 * 4/3) = 13.
  const CropBox wide = draw_resized_crop(1, 0, 0, 10, 1000, &ignored);
  EXPECT_EQ(wide.height, 10);
  EXPECT_EQ(wide.width, 13);
  EXPECT_EQ(wide.top, 0);
  EXPECT_EQ(wide.left, (1000 - 13) / 2);
  const CropBox tall = draw_resized_crop(1, 0, 0, 1000, 10, &ignored);
  EXPECT_EQ(tall.width, 10);
  EXPECT_EQ(tall.height, 13);
  EXPECT_EQ(tall.top, (1000 - 13) / 2);
  // The test transform's sizes as torchvision computes them.
  EXPECT_EQ(eval_resize_size(224), 256);
  EXPECT_EQ(eval_resize_size(32), 36);
  const ResizedCenterCrop g = resized_center_crop(375, 500, 224);
  EXPECT_EQ(g.resized_h, 256);
  EXPECT_EQ(g.resized_w, 341);  // int(256 * 500 / 375) = int(341.33)
  EXPECT_EQ(g.crop.top, 16);
  EXPECT_EQ(g.crop.left, 58);  // round(58.5) = 58, half to even as Python's round
}

// --image_size on images that share a size: the same size keeps the CIFAR pipeline (no
// resampling); another size resamples; batches come out S x S, normalised, deterministic.
TEST(ImageFolderTest, ImageSizeChoosesBetweenKeepingAndResampling) {
  TempDir dir;
  write_tree(dir.path() / "folder", small_folder("", "test", 16));
  ImageFolderOptions same;
  same.image_size = 16;
  const DatasetSplits kept = load_image_folder((dir.path() / "folder").string(), same);
  EXPECT_FALSE(kept.train.resampled());
  EXPECT_EQ(kept.train.pixels, load_image_folder((dir.path() / "folder").string(), {}).train.pixels);
  ImageFolderOptions other;
  other.image_size = 24;
  const DatasetSplits s = load_image_folder((dir.path() / "folder").string(), other);
  ASSERT_TRUE(s.train.resampled());
  EXPECT_EQ(s.train.height, 24);
  EXPECT_EQ(s.train.stored_height(0), 16);
  EXPECT_EQ(s.train.image_elems(), 3 * 24 * 24);
  EXPECT_EQ(s.train.pixels.size(), size_t{5} * 3 * 16 * 16);
  // The statistics are those of the stored pixels, as without --image_size.
  EXPECT_EQ(s.train.mean, kept.train.mean);
  std::vector<float> a(3 * 24 * 24), b(a.size()), e(a.size());
  load_image(s.train, 1, true, 7, 2, a.data());
  load_image(s.train, 1, true, 7, 2, b.data());
  EXPECT_EQ(a, b);
  load_image(s.test, 0, false, 7, 2, e.data());
  std::vector<uint8_t> raw(a.size()), scratch;
  eval_pixels(s.test, 0, 24, raw.data(), scratch);
  for (size_t i = 0; i < raw.size(); ++i) {
    const int64_t c = static_cast<int64_t>(i) / (24 * 24);
    ASSERT_NEAR(e[i], (raw[i] / 255.0f - s.test.mean[c]) / s.test.stddev[c], 1e-5) << i;
  }
  // Truncation keeps the layout consistent.
  ImageDataset t = s.train;
  truncate(t, 2);
  EXPECT_EQ(t.stored.size(), 2u);
  EXPECT_EQ(t.pixels.size(), size_t{2} * 3 * 16 * 16);
}


// Over max_decoded_bytes a split keeps its JPEG bytes and decodes per batch, on its decode
// threads: the batches are the same as from the decoded split (one size, CIFAR pipeline; and
// mixed sizes through the --image_size transforms), and so are the statistics.
TEST(ImageFolderTest, LargeSplitsDecodePerEpochToTheSameBatches) {
  TempDir dir;
  auto files = small_folder("", "test", 16);
  write_tree(dir.path() / "one_size", files);
  files["train/dog/z.jpg"] = make_jpeg(40, 28, 9);
  files["test/dog/w.jpg"] = make_jpeg(23, 37, 10);
  write_tree(dir.path() / "mixed", files);
  for (const auto& [folder, image_size] :
       std::vector<std::pair<std::string, int64_t>>{{"one_size", 0}, {"mixed", 24}}) {
    SCOPED_TRACE(folder);
    ImageFolderOptions kept;
    kept.image_size = image_size;
    kept.threads = 2;
    ImageFolderOptions per_epoch = kept;
    per_epoch.max_decoded_bytes = 3 * 16 * 16 * 2;  // room for two images of the smallest size
    const auto path = (dir.path() / folder).string();
    const DatasetSplits a = load_image_folder(path, kept);
    const DatasetSplits b = load_image_folder(path, per_epoch);
    ASSERT_FALSE(a.train.decodes_per_epoch());
    ASSERT_TRUE(b.train.decodes_per_epoch());
    EXPECT_TRUE(b.train.pixels.empty());
    EXPECT_EQ(b.train.decode_threads, 2);
    EXPECT_EQ(b.train.encoded_offsets.size(), static_cast<size_t>(b.train.size()) + 1);
    EXPECT_EQ(b.train.mean, a.train.mean);
    EXPECT_EQ(b.train.stddev, a.train.stddev);
    EXPECT_EQ(b.train.sources, a.train.sources);
    EXPECT_EQ(b.train.height, a.train.height);
    std::vector<int64_t> all(static_cast<size_t>(a.train.size()));
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(all.size() - 1 - i);
    for (const bool augment : {true, false}) {
      const Batch x = make_batch(a.train, all, augment, 3, 1);
      const Batch y = make_batch(b.train, all, augment, 3, 1);
      EXPECT_EQ(x.images, y.images) << "augment " << augment;
      EXPECT_EQ(x.labels, y.labels);
    }
    std::vector<int64_t> test_all(static_cast<size_t>(a.test.size()));
    for (size_t i = 0; i < test_all.size(); ++i) test_all[i] = static_cast<int64_t>(i);
    EXPECT_EQ(make_batch(a.test, test_all, false, 3, 1).images,
              make_batch(b.test, test_all, false, 3, 1).images);
    // Truncation keeps the encoded layout consistent.
    ImageDataset t = b.train;
    truncate(t, 2);
    EXPECT_EQ(t.encoded_offsets.size(), 3u);
    EXPECT_EQ(static_cast<int64_t>(t.encoded.size()), t.encoded_offsets.back());
    EXPECT_EQ(make_batch(t, {1, 0}, true, 3, 1).images, make_batch(a.train, {1, 0}, true, 3, 1).images);
  }
}

}  // namespace
}  // namespace dlaunch::data
