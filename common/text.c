/* See text.h. */
#include "common/text.h"

#include <string.h>

bool ls_text_bool(const char *text, bool *out) {
    if (!strcmp(text, "true") || !strcmp(text, "1")) *out = true;
    else if (!strcmp(text, "false") || !strcmp(text, "0")) *out = false;
    else return false;
    return true;
}
