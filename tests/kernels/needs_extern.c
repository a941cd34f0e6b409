/* Metadata is fine, but the library leaves a symbol undefined (not self-contained): dlopen must fail clearly. */
#include "tether_abi.h"
TETHER_META("{\"abi_version\": 1, \"target\": {\"arch\": \"" TETHER_ARCH "\"}, \"functions\": "
            "[{\"name\": \"f\", \"args\": []}]}");
extern int32_t tether_no_such_symbol(void);
TETHER_EXPORT int32_t f(const TetherValue* args, const int32_t* codes, int32_t num_args) {
  (void)args; (void)codes; (void)num_args; return tether_no_such_symbol();
}
