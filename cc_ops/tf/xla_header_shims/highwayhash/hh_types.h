// Declarations only: see ../README.md.
#pragma once
