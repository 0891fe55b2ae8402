// Declarations only: see ../README.md. The member of xla::HighwayHashPrinter needs a complete type.
#pragma once
namespace highwayhash {
template <unsigned Target>
class HighwayHashCatT {
  char state_[512];
};
}  // namespace highwayhash
