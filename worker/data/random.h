// The data pipeline's counter-based randomness (kernels/splitmix.h: one code for the CPU loader
// and the GPU augmentation kernel) under the data:: names its users spell, plus the draws only
// the host needs.
#pragma once

#include <cstdint>

#include "kernels/splitmix.h"

namespace dlaunch::data {

using kernels::hash_combine;
using kernels::SplitMix;
using kernels::splitmix64;

// A standard normal draw from `rng`, by Box-Muller (the synthetic data set's noise).
double normal(SplitMix& rng);

}  // namespace dlaunch::data
