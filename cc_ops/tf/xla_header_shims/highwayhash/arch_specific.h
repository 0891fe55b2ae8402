// Declarations only: see ../README.md.
#pragma once
#define HH_TARGET_PREFERRED 0
