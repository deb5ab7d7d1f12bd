/* Why a PEFT directory lacks the file a load needs, when the directory
 * shows it: an adapter saved in a subfolder (PEFT names it after a
 * non-default adapter), a pickled adapter_model.bin. Private to
 * lora/loader.c. */
#ifndef LS_LORA_LOADER_ABSENT_H
#define LS_LORA_LOADER_ABSENT_H

#include <stdbool.h>

#include "common/error.h"

/* dir_fd is the opened directory rel (shown as rel), borrowed. When it
 * has no adapter_config.json and a reason shows, sets err and returns
 * true; false leaves err untouched (the plain "does not exist" follows). */
bool ls_loader_explain_no_config(int dir_fd, const char *rel, ls_error *err);
/* Same for adapter_model.safetensors. */
bool ls_loader_explain_no_model(int dir_fd, const char *rel, ls_error *err);

#endif
