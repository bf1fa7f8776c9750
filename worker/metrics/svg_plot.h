// The training curves as a self-contained SVG (no plotting library): left panel loss (train
// loss per logged step, train and test loss per epoch) against epochs, right panel train and
// test accuracy per epoch. Built from metrics.jsonl records, so a resumed run plots its whole
// history: the line that survived, without the steps a restart or a resume redid (see
// surviving_records). Pure functions; write_curves_svg blocks on the file write and throws
// SystemError.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace dlaunch::metrics {

// The step and epoch records of the training that survived, step lines then epoch lines, each
// in step order. A "start" record at step S (a run or a restarted attempt resuming there) drops
// the records after S written before it: those steps were lost and are redone. A step (epoch)
// record also replaces the earlier ones of its step (epoch) and after, for files without start
// records. So each step keeps the record of the newest attempt that logged it.
std::vector<nlohmann::json> surviving_records(const std::vector<nlohmann::json>& records);

std::string render_curves_svg(const std::vector<nlohmann::json>& records, const std::string& title);
void write_curves_svg(const std::string& path, const std::vector<nlohmann::json>& records,
                      const std::string& title);

}  // namespace dlaunch::metrics
