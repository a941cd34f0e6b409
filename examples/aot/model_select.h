/* Which AOT model the examples are built against: -DMODEL_HEADER='"bench.h"' -DMODEL_PREFIX=bench for a model
 * compiled with --name bench; model.h and the prefix "model" by default. M(run) names that model's model_run. */
#ifndef TETHER_EXAMPLE_MODEL_SELECT_H
#define TETHER_EXAMPLE_MODEL_SELECT_H

#ifndef MODEL_HEADER
#define MODEL_HEADER "model.h"
#endif
#ifndef MODEL_PREFIX
#define MODEL_PREFIX model
#endif
#include MODEL_HEADER

#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define M(name) CAT(MODEL_PREFIX, name) /* M(run) -> model_run */

#endif
