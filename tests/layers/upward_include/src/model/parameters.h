// Stands in for the model layer.
#pragma once
