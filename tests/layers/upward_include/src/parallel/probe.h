// A parallel/ header that includes a model/ header: the layer check must refuse it.
#pragma once

#include "model/parameters.h"
