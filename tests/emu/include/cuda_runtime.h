// The CUDA runtime with the device builtins (emu/emu.h).
#pragma once

#include "cuda_runtime_api.h"
#include "emu/emu.h"
