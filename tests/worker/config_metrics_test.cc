// dtrain's flag parsing, metrics.jsonl reading and the SVG curves.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "worker/metrics/metrics_log.h"
#include "worker/metrics/svg_plot.h"
#include "worker/train/fault_injection.h"
#include "worker/train/train_config.h"

namespace dlaunch {
namespace {

train::TrainConfig parse(std::vector<std::string> args) {
  bool help = false;
  return train::parse_train_args(args, &help);
}

TEST(TrainConfig, DefaultsAreTheQuickSyntheticRun) {
  train::TrainConfig c = parse({});
  EXPECT_EQ(c.dataset, "synthetic");
  EXPECT_EQ(c.model, "resnet18");
  EXPECT_EQ(c.width, 16);
  EXPECT_EQ(c.resume, "auto");
  EXPECT_TRUE(c.augment());
}

TEST(TrainConfig, SpellingsAndBooleans) {
  train::TrainConfig c = parse({"--batch-size", "32", "--lr=0.5", "--sync_bn", "--nesterov=false",
                                "--model=resnet34", "--dataset", "mnist", "--no-augment"});
  EXPECT_EQ(c.batch_size, 32);
  EXPECT_DOUBLE_EQ(c.lr, 0.5);
  EXPECT_TRUE(c.sync_bn);
  EXPECT_FALSE(c.nesterov);
  EXPECT_EQ(c.depth(), 34);
  EXPECT_FALSE(c.augment());
  bool help = false;
  train::parse_train_args({"--help"}, &help);
  EXPECT_TRUE(help);
  for (const char* flag : {"--model", "--sync_bn", "--resume", "--max_steps", "--no_augment"}) {
    EXPECT_NE(train::train_usage().find(flag), std::string::npos) << flag;
  }
}

// The fast recipe's options (issue 11): off by default, so the default run does not change.
TEST(TrainConfig, RecipeOptionsAreOffByDefaultAndParse) {
  const train::TrainConfig defaults = parse({});
  EXPECT_EQ(defaults.label_smoothing, 0.0);
  EXPECT_FALSE(defaults.no_bn_weight_decay);
  EXPECT_EQ(defaults.bn_lr_scale, 1.0);
  EXPECT_TRUE(parse({"--no-bn-weight-decay"}).no_bn_weight_decay);
  EXPECT_DOUBLE_EQ(parse({"--bn_lr_scale", "4"}).bn_lr_scale, 4.0);
  EXPECT_THROW(parse({"--bn_lr_scale=-1"}), UsageError);
  EXPECT_EQ(defaults.lr_schedule, "cosine");
  EXPECT_EQ(defaults.tta, "none");
  EXPECT_EQ(defaults.cutout, 0);
  EXPECT_FALSE(defaults.alternating_flip);
  EXPECT_EQ(parse({"--cutout=12"}).cutout, 12);
  EXPECT_TRUE(parse({"--alternating-flip"}).alternating_flip);
  EXPECT_THROW(parse({"--cutout=-1"}), UsageError);
  EXPECT_THROW(parse({"--cutout=8", "--image_size=64"}), UsageError);
  EXPECT_EQ(parse({"--tta", "flip"}).tta, "flip");
  EXPECT_THROW(parse({"--tta=crops"}), UsageError);
  EXPECT_EQ(parse({"--lr-schedule=triangle"}).lr_schedule, "triangle");
  EXPECT_DOUBLE_EQ(parse({"--label-smoothing=0.1"}).label_smoothing, 0.1);
  EXPECT_THROW(parse({"--label_smoothing=1"}), UsageError);
  EXPECT_THROW(parse({"--label_smoothing=-0.1"}), UsageError);
  for (const char* flag : {"--label_smoothing", "--no_bn_weight_decay", "--bn_lr_scale", "--tta", "--cutout",
                           "--alternating_flip"})
    EXPECT_NE(train::train_usage().find(flag), std::string::npos) << flag;
}

TEST(TrainConfig, EmaIsOffByDefaultAndParses) {
  EXPECT_EQ(parse({}).ema, 0.0);
  EXPECT_EQ(parse({}).ema_every, 1);
  const train::TrainConfig c = parse({"--ema=0.999", "--ema-every", "5"});
  EXPECT_DOUBLE_EQ(c.ema, 0.999);
  EXPECT_EQ(c.ema_every, 5);
  EXPECT_THROW(parse({"--ema=1"}), UsageError);
  EXPECT_THROW(parse({"--ema=-0.5"}), UsageError);
  EXPECT_THROW(parse({"--ema_every=0"}), UsageError);
  for (const char* flag : {"--ema ", "--ema_every"})
    EXPECT_NE(train::train_usage().find(flag), std::string::npos) << flag;
}

// --recipe cifar-fast sets the fast options; explicit flags win wherever they stand on the
// command line, and the recipe's warm-up (20% of the epochs) follows an --epochs override.
TEST(TrainConfig, RecipeCifarFastSetsTheFastOptionsAndExplicitFlagsOverrideIt) {
  const train::TrainConfig fast = parse({"--recipe", "cifar-fast"});
  EXPECT_EQ(fast.recipe, "cifar-fast");
  EXPECT_EQ(fast.dataset, "cifar10");
  EXPECT_EQ(fast.width, 64);
  EXPECT_EQ(fast.epochs, 26);
  EXPECT_EQ(fast.batch_size, 500);
  EXPECT_DOUBLE_EQ(fast.lr, 0.2);
  EXPECT_EQ(fast.lr_schedule, "triangle");
  EXPECT_DOUBLE_EQ(fast.warmup_epochs, 5.2);
  EXPECT_TRUE(fast.nesterov);
  EXPECT_TRUE(fast.no_bn_weight_decay);
  EXPECT_DOUBLE_EQ(fast.label_smoothing, 0.2);
  EXPECT_EQ(fast.cutout, 12);
  EXPECT_TRUE(fast.alternating_flip);
  EXPECT_EQ(fast.tta, "flip");
  EXPECT_DOUBLE_EQ(fast.ema, 0.99);
  EXPECT_EQ(fast.ema_every, 5);
  EXPECT_TRUE(fast.ema_warmup);
  EXPECT_FALSE(parse({}).ema_warmup);
  EXPECT_TRUE(fast.recipe_overrides.empty());
  const std::string text = train::describe_recipe(fast);
  for (const char* part : {"--recipe cifar-fast:", "--batch_size=500", "--lr_schedule=triangle",
                           "--label_smoothing=0.2", "--ema=0.99", "--tta=flip"})
    EXPECT_NE(text.find(part), std::string::npos) << part << " in " << text;
  EXPECT_EQ(text.find("overridden"), std::string::npos) << text;

  // Before and after --recipe alike.
  const train::TrainConfig mine =
      parse({"--epochs=2", "--recipe=cifar-fast", "--width", "8", "--tta=none", "--dataset=synthetic"});
  EXPECT_EQ(mine.epochs, 2);
  EXPECT_EQ(mine.width, 8);
  EXPECT_EQ(mine.tta, "none");
  EXPECT_EQ(mine.dataset, "synthetic");
  EXPECT_DOUBLE_EQ(mine.warmup_epochs, 0.4);
  EXPECT_EQ(mine.batch_size, 500);  // not overridden: the recipe's
  EXPECT_EQ(mine.recipe_overrides,
            (std::vector<std::string>{"--width=8", "--dataset=synthetic", "--epochs=2", "--tta=none"}));
  EXPECT_NE(train::describe_recipe(mine).find(
                "overridden by the command line: --width=8 --dataset=synthetic --epochs=2 --tta=none"),
            std::string::npos)
      << train::describe_recipe(mine);
  EXPECT_DOUBLE_EQ(parse({"--recipe=cifar-fast", "--warmup_epochs=1"}).warmup_epochs, 1.0);
  EXPECT_DOUBLE_EQ(parse({"--epochs=10", "--warmup_epochs=30%"}).warmup_epochs, 3.0);
  EXPECT_THROW(parse({"--warmup_epochs=100%"}), UsageError);

  // No recipe: nothing changes, nothing to describe; an unknown one names the known ones.
  EXPECT_EQ(parse({}).recipe, "none");
  EXPECT_EQ(train::describe_recipe(parse({})), "");
  try {
    parse({"--recipe=fast"});
    ADD_FAILURE() << "--recipe=fast was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("none, cifar-fast"), std::string::npos) << e.what();
  }
}

TEST(TrainConfig, OverwriteStartsANewRunAndContradictsAResumePath) {
  EXPECT_TRUE(parse({"--overwrite"}).overwrite);
  EXPECT_NO_THROW(parse({"--overwrite", "--resume=none"}));
  try {
    parse({"--overwrite", "--resume=out/checkpoint_epoch_0002.dtck"});
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--overwrite starts a new run but --resume="),
              std::string::npos)
        << e.what();
  }
  EXPECT_NE(train::train_usage().find("--overwrite"), std::string::npos);
}

TEST(TrainConfig, TensorBoardFilesAreOnByDefaultAndCanBeTurnedOff) {
  EXPECT_TRUE(parse({}).tensorboard);
  EXPECT_FALSE(parse({"--tensorboard=false"}).tensorboard);
  EXPECT_TRUE(parse({"--tensorboard"}).tensorboard);
  EXPECT_NE(train::train_usage().find("--tensorboard"), std::string::npos);
}

TEST(TrainConfig, DataDirMustBeADirectoryWhenItIsRead) {
  EXPECT_NO_THROW(train::check_data_dir(parse({})));  // synthetic, no --data_dir: not read
  EXPECT_THROW(train::check_data_dir(parse({"--data_dir=/nonexistent"})), UsageError);
  EXPECT_THROW(train::check_data_dir(parse({"--dataset=mnist", "--data_dir=/nonexistent"})),
               UsageError);
  EXPECT_THROW(train::check_data_dir(parse({"--dataset=mnist", "--data_dir=/etc/hostname"})),
               UsageError);
  EXPECT_NO_THROW(train::check_data_dir(parse({"--dataset=mnist", "--data_dir=/tmp"})));
}

TEST(TrainConfig, BadValuesSayWhatIsAllowed) {
  auto message = [](std::vector<std::string> args) -> std::string {
    try {
      parse(args);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message({"--model=resnet50"}).find("resnet18, resnet34"), std::string::npos);
  EXPECT_NE(message({"--epochs=0"}).find("--epochs=0 is below 1; expected an integer from 1"), std::string::npos);
  EXPECT_NE(message({"--lr=-1"}).find("--lr=-1 is below 0; expected a learning rate >= 0"),
            std::string::npos);
  EXPECT_NE(message({"--width"}).find("needs a value"), std::string::npos);
  EXPECT_NE(message({"--frobnicate"}).find("unknown flag"), std::string::npos);
  EXPECT_EQ(message({"--frobnicate"}).find("did you mean"), std::string::npos) << "no flag is near";
  // A typo gets the flag it was probably meant to be (dashes or underscores alike).
  EXPECT_NE(message({"--epoch=3"}).find("unknown flag '--epoch=3' (did you mean --epochs?)"),
            std::string::npos)
      << message({"--epoch=3"});
  EXPECT_NE(message({"--batch-szie", "8"}).find("(did you mean --batch_size?)"), std::string::npos)
      << message({"--batch-szie", "8"});
  EXPECT_NE(message({"--skip_bad_image"}).find("(did you mean --skip_bad_images?)"), std::string::npos);
  EXPECT_NE(message({"stray"}).find("unexpected argument"), std::string::npos);
  EXPECT_NE(message({"--nesterov", "--momentum=0"}).find("momentum"), std::string::npos);
  EXPECT_NE(message({"--epochs=2", "--warmup_epochs=2"}).find("below"), std::string::npos);
  EXPECT_NE(message({"--image_size=4"}).find("expected 0 (the images' own size) or at least 8"),
            std::string::npos);
  EXPECT_NE(message({"--stem=resnet"}).find("auto, imagenet, cifar"), std::string::npos)
      << message({"--stem=resnet"});
  EXPECT_EQ(parse({"--image-size=224", "--stem=imagenet"}).image_size, 224);
  EXPECT_NE(message({"--max_decoded_mib=-1"}).find("is below 0; expected MiB from 0 to"), std::string::npos);
  EXPECT_EQ(parse({"--max-decoded-mib=0"}).max_decoded_mib, 0);
  EXPECT_EQ(parse({}).max_decoded_mib, 4096);
}

// --rank_recovery: on by default (dtrain survives a peer's death when dlaunch offers it), off
// turns it off, anything else is bad usage naming the choices.
TEST(TrainConfig, RankRecoveryIsOnByDefaultAndTakesOnOrOff) {
  EXPECT_TRUE(parse({}).rank_recovery);
  EXPECT_FALSE(parse({"--rank_recovery", "off"}).rank_recovery);
  EXPECT_TRUE(parse({"--rank_recovery=on"}).rank_recovery);
  try {
    parse({"--rank_recovery=yes"});
    ADD_FAILURE() << "--rank_recovery=yes was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--rank_recovery"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("off"), std::string::npos) << e.what();
  }
  EXPECT_NE(train::train_usage().find("--rank_recovery"), std::string::npos);
}

// --elastic_batch: what a shrink in process keeps; per_rank by default, anything else but global
// is bad usage naming the choices.
TEST(TrainConfig, ElasticBatchIsPerRankByDefaultAndTakesPerRankOrGlobal) {
  EXPECT_EQ(parse({}).elastic_batch, "per_rank");
  EXPECT_EQ(parse({"--elastic_batch", "global"}).elastic_batch, "global");
  EXPECT_EQ(parse({"--elastic_batch=per_rank"}).elastic_batch, "per_rank");
  try {
    parse({"--elastic_batch=both"});
    ADD_FAILURE() << "--elastic_batch=both was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--elastic_batch"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("per_rank"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("global"), std::string::npos) << e.what();
  }
  EXPECT_NE(train::train_usage().find("--elastic_batch"), std::string::npos);
}

// Issue 27: "nan" was a number (--lr nan said "negative", --collective_timeout nan passed);
// every numeric flag refuses nan and inf (but --lr inf, which dtrain stops on as divergence)
// with exit 2, and a range error names the bound crossed.
TEST(TrainConfig, NumericFlagsRefuseNanAndInfinityAndNameTheBound) {
  auto message = [](std::vector<std::string> args) -> std::string {
    try {
      parse(args);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "";
  };
  const std::vector<std::string> numeric = {
      "lr",        "warmup_epochs", "momentum", "weight_decay",     "bn_lr_scale", "ema",
      "label_smoothing", "collective_timeout", "width", "epochs", "batch_size", "cutout",
      "ema_every", "seed",          "eval_every", "threads",        "log_every",   "max_steps",
      "flash_every", "image_size",  "max_decoded_mib"};
  for (const std::string& flag : numeric) {
    EXPECT_NE(train::train_usage().find("--" + flag + " "), std::string::npos) << flag;
    for (const char* bad : {"nan", "NaN", "-nan", "-inf"}) {
      const std::string text = message({"--" + flag + "=" + bad});
      EXPECT_NE(text.find("--" + flag + "="), std::string::npos) << flag << "=" << bad << ": " << text;
      EXPECT_EQ(text.find("negative"), std::string::npos) << text;
    }
    if (flag != "lr") {
      EXPECT_NE(message({"--" + flag + "=inf"}), "") << flag << "=inf was accepted";
      EXPECT_NE(message({"--" + flag + "=infinity"}), "") << flag << "=infinity was accepted";
    }
  }
  EXPECT_NE(message({"--lr=nan"}).find("--lr=nan is not a number; expected a learning rate >= 0"),
            std::string::npos)
      << message({"--lr=nan"});
  EXPECT_TRUE(std::isinf(parse({"--lr=inf"}).lr));
  EXPECT_NE(message({"--momentum=inf"}).find("is not finite"), std::string::npos);
  EXPECT_NE(message({"--collective_timeout=nan"}).find("is not a number"), std::string::npos);
  EXPECT_NE(message({"--collective_timeout=0"}).find("is not above 0"), std::string::npos);
  EXPECT_NE(message({"--collective_timeout=1e300"}).find("is above 1000000000"), std::string::npos);
  EXPECT_NE(message({"--ema=1"}).find("--ema=1 is not below 1; expected a decay"), std::string::npos);
  EXPECT_NE(message({"--warmup_epochs=nan%"}).find("--warmup_epochs=nan% is not a number"),
            std::string::npos)
      << message({"--warmup_epochs=nan%"});
  EXPECT_NE(message({"--warmup_epochs=100%"}).find("is not below 100"), std::string::npos);
  EXPECT_NE(message({"--epochs=2000000000"}).find("is above 1000000000; expected an integer from 1 to "
                                                  "1000000000"),
            std::string::npos)
      << message({"--epochs=2000000000"});
  EXPECT_NE(message({"--max_decoded_mib=9000000000000"}).find("is above 8796093022207"),
            std::string::npos);
}

TEST(Metrics, WritesReadsAndSkipsTornLines) {
  std::string path = std::filesystem::temp_directory_path() /
                     ("dtrain_metrics_" + std::to_string(::getpid()) + ".jsonl");
  std::filesystem::remove(path);
  {
    metrics::MetricsLog log(path, 0);
    log.write({{"kind", "step"}, {"epoch_progress", 0.5}, {"loss", 2.0}});
    log.write({{"kind", "epoch"}, {"epoch", 1}, {"loss", 1.5}, {"train_accuracy", 0.4},
               {"test_loss", 1.6}, {"test_accuracy", 0.35}});
  }
  {
    std::ofstream torn(path, std::ios::app);
    torn << "{\"kind\": \"step\", \"lo";  // a crash mid-line
  }
  {
    metrics::MetricsLog log(path, 1);  // a resumed run appends
    log.write({{"kind", "epoch"}, {"epoch", 2}, {"loss", 1.0}, {"train_accuracy", 0.6},
               {"test_loss", 1.1}, {"test_accuracy", 0.55}});
  }
  auto records = metrics::read_metrics(path);
  // The torn line is dropped; the resumed run's record after it survives.
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[2]["epoch"], 2);
  EXPECT_EQ(records[0]["attempt"], 0);  // each record says which attempt wrote it
  EXPECT_EQ(records[2]["attempt"], 1);
  // and when (TensorBoard's wall time), in seconds since the Unix epoch: after 2020, in order.
  EXPECT_GT(records[0]["time"].get<double>(), 1.58e9);
  EXPECT_LE(records[0]["time"].get<double>(), records[2]["time"].get<double>());
  std::string svg = metrics::render_curves_svg(records, "run <1>");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("run &lt;1&gt;"), std::string::npos);
  EXPECT_NE(svg.find("test accuracy"), std::string::npos);
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
  std::filesystem::remove(path);
}

// Issue 27: after a flash restart metrics.jsonl holds the redone steps twice and curves.svg
// plotted both. The line that survived: attempt 1 starts again at step 8 (its flash copy), so the
// first attempt's step 12 and its partial epoch 2 are dropped; each step keeps one record.
TEST(Metrics, ThePlotKeepsTheNewestAttemptOfEachStep) {
  using nlohmann::json;
  auto step = [](int64_t s, double loss, int attempt) {
    return json{{"kind", "step"}, {"step", s}, {"epoch_progress", s / 8.0}, {"loss", loss},
                {"attempt", attempt}};
  };
  const std::vector<json> records = {
      {{"kind", "start"}, {"step", 0}, {"attempt", 0}},
      step(4, 2.0, 0),
      step(8, 1.8, 0),
      {{"kind", "epoch"}, {"epoch", 1}, {"step", 8}, {"loss", 1.9}, {"train_accuracy", 0.3}},
      step(12, 9.0, 0),
      {{"kind", "epoch"}, {"epoch", 2}, {"step", 13}, {"loss", 9.0}, {"train_accuracy", 0.1}},
      {{"kind", "start"}, {"step", 8}, {"attempt", 1}},
      step(12, 1.5, 1),
      step(16, 1.2, 1),
      {{"kind", "epoch"}, {"epoch", 2}, {"step", 16}, {"loss", 1.4}, {"train_accuracy", 0.5}},
      // An older file without start records: a step logged again replaces the earlier one.
      step(16, 1.1, 2),
  };
  const std::vector<json> kept = metrics::surviving_records(records);
  std::vector<std::pair<int64_t, double>> steps;
  std::vector<std::pair<int64_t, double>> epochs;
  for (const json& r : kept) {
    (r["kind"] == "step" ? steps : epochs).emplace_back(r["step"].get<int64_t>(), r["loss"].get<double>());
  }
  EXPECT_EQ(steps, (std::vector<std::pair<int64_t, double>>{{4, 2.0}, {8, 1.8}, {12, 1.5}, {16, 1.1}}));
  EXPECT_EQ(epochs, (std::vector<std::pair<int64_t, double>>{{8, 1.9}, {16, 1.4}}));
  // The plot draws that line: the step-loss polyline (the first) has 4 points, not 6.
  const std::string svg = metrics::render_curves_svg(records, "restarted");
  const size_t at = svg.find("points=\"");
  ASSERT_NE(at, std::string::npos) << svg;
  const std::string points = svg.substr(at + 8, svg.find('"', at + 8) - at - 8);
  EXPECT_EQ(std::count(points.begin(), points.end(), ','), 4) << points;
}

TEST(Metrics, EmptyHistoryStillRenders) {
  std::string svg = metrics::render_curves_svg({}, "empty");
  EXPECT_NE(svg.find("no data"), std::string::npos);
}

}  // namespace
}  // namespace dlaunch

// DTRAIN_FAIL_AT_STEP / DTRAIN_FAIL_RANK: one death, or several in one run (a rank replaced in
// process keeps the attempt, so its replacement meets the later points).
TEST(FaultInjection, StepListsTakeOneRankOrOnePerStep) {
  using dlaunch::train::parse_fault_points;
  EXPECT_TRUE(parse_fault_points("", "", 2).empty());
  auto one = parse_fault_points("7", "", 2);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].step, 7);
  EXPECT_EQ(one[0].rank, 2);  // the default: the last rank
  auto same = parse_fault_points("3,9", "1", 2);
  ASSERT_EQ(same.size(), 2u);
  EXPECT_EQ(same[1].step, 9);
  EXPECT_EQ(same[1].rank, 1);
  auto each = parse_fault_points("3,9,12", "1,0,2", 2);
  ASSERT_EQ(each.size(), 3u);
  EXPECT_EQ(each[1].rank, 0);
  EXPECT_EQ(each[2].step, 12);
  dlaunch::train::FaultInjection fault;
  fault.points = each;
  EXPECT_TRUE(fault.fires(9, 0));
  EXPECT_FALSE(fault.fires(9, 1));
  EXPECT_THROW(parse_fault_points("3,x", "", 1), dlaunch::UsageError);
  EXPECT_TRUE(parse_fault_points("-1", "", 1).empty());  // off, as before the lists
  EXPECT_EQ(parse_fault_points("3,-1", "", 1).size(), 1u);
  EXPECT_THROW(parse_fault_points("3,9", "1,0,2", 2), dlaunch::UsageError);
}
