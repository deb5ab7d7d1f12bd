/* A growable byte buffer with printf-style appends, for response bodies
 * and rendered metrics. */
#ifndef LS_COMMON_BUF_H
#define LS_COMMON_BUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    char *data; /* owned, NUL-terminated while not failed */
    size_t len, cap;
    bool failed; /* an allocation failed; the content is incomplete */
} ls_buf;

void ls_buf_init(ls_buf *b);
void ls_buf_free(ls_buf *b);
bool ls_buf_append(ls_buf *b, const void *data, size_t len);
bool ls_buf_printf(ls_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Grows the content by len bytes and returns where they start, for the
 * caller to write them all (the NUL after them is set); NULL if failed. */
char *ls_buf_extend(ls_buf *b, size_t len);
/* Hands the data to the caller (who frees it); b is reset. NULL if failed. */
char *ls_buf_take(ls_buf *b, size_t *len);

#endif
