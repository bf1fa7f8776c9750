// --recipe NAME: a documented preset of dtrain's own flags (docs/dtrain.md, Recipes). The preset
// is applied before the command line, so any flag given explicitly overrides it, whatever the
// order of the two; the start-up log prints what the preset set and what was overridden.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace dlaunch::train {

// The recipes' names, "none" first (the default: no preset).
const std::vector<std::string>& recipe_names();

// The flags a recipe sets, as (flag name without dashes, value), in the order they are applied;
// empty for "none". The caller checked the name against recipe_names().
const std::vector<std::pair<std::string, std::string>>& recipe_flags(const std::string& name);

}  // namespace dlaunch::train
