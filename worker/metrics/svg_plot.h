// The training curves as a self-contained SVG (no plotting library): left panel loss (train
// loss per logged step, train and test loss per epoch) against epochs, right panel train and
// test accuracy per epoch. Built from metrics.jsonl records, so a resumed run plots its whole
// history. Pure function; write_curves_svg blocks on the file write and throws SystemError.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace dlaunch::metrics {

std::string render_curves_svg(const std::vector<nlohmann::json>& records, const std::string& title);
void write_curves_svg(const std::string& path, const std::vector<nlohmann::json>& records,
                      const std::string& title);

}  // namespace dlaunch::metrics
