/* The allocation-failure hook of the fault tests: counts the allocations
 * the code under test makes and fails the Nth one (NULL, errno ENOMEM)
 * while armed, and keeps the set of live allocations so a test can check
 * that an operation, failed or not, gives back everything it took.
 *
 * How: the fault programs are linked with
 *   -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=free,
 *   --wrap=strdup,--wrap=strndup,--wrap=posix_memalign,--wrap=aligned_alloc
 * (and json_loads, json_loadb, json_loadf: below; see
 * tests/fault/CMakeLists.txt), so every call to those functions from an
 * object linked into the test executable reaches the __wrap_* functions
 * of fault_alloc.c, which call the real ones (__real_*) unless this call
 * is the one to fail. jansson allocates inside its shared library, where
 * --wrap does not reach: fa_init routes it through the same counter with
 * json_set_alloc_funcs.
 *
 * The limit: --wrap only rewrites references in the objects of this link
 * (our static libraries, the test and its helpers). Allocations made
 * inside shared libraries other than jansson (libc itself: opendir,
 * fdopendir, stdio buffers, qsort's scratch; libmicrohttpd; libcurl;
 * cmocka) are neither counted nor failed, and memory they allocate is
 * not in the live set (freeing it through our free is fine: a pointer we
 * do not know is passed on untouched). The other way round, memory of
 * ours that a shared library frees (libmicrohttpd frees the response
 * bodies) stays in the live set: a program that serves HTTP cannot
 * compare live counts.
 *
 * jansson's parser is not counted: the programs also wrap json_loads,
 * json_loadb and json_loadf, and the allocations made inside them are
 * tracked but never failed. jansson 2.14's lexer ignores a failed growth
 * of its token buffer (lex_save drops strbuffer_append_byte's -1,
 * akheron/jansson#362): the parse then goes on with a byte missing, so a
 * string or a number comes back silently altered ("a-rather-long-adapter-
 * name" parsed as "a-rather-long-dapter-name", 0.12345678901234567 as
 * 0.12345678901235679), or the lexer loses its place and reads past its
 * buffer (a SIGSEGV in json_loads, seen here on adapter_config.json), and
 * most other failures there are reported as syntax errors. No caller can
 * make that clean, so failing those allocations would only test jansson.
 * FAULT_JANSSON_PARSE=1 fails them too, to see it. jansson's other
 * allocations (json_pack, json_dumps, json_object_set...) are counted
 * and failed like ours. */
#ifndef LS_TESTS_FAULT_ALLOC_H
#define LS_TESTS_FAULT_ALLOC_H

#include <stdbool.h>
#include <stddef.h>

/* Routes jansson through the hook. Call once, first thing in main. */
void fa_init(void);

/* Starts counting allocations from zero; the nth one from now (1-based)
 * fails. n = 0 counts without failing anything. */
void fa_arm(long n);
/* Stops counting (and failing). */
void fa_disarm(void);
/* Allocations seen since the last fa_arm (until fa_disarm). */
long fa_count(void);
/* True when the armed failure happened since the last fa_arm. */
bool fa_fired(void);

/* Fails jansson's parser's allocations too (as FAULT_JANSSON_PARSE=1
 * does), for a program whose parsed texts are too short for the lexer's
 * token buffer to grow, the one failure jansson 2.14 mishandles. */
void fa_fail_parser(bool on);

/* Allocations made through the hook and not yet freed (every thread,
 * armed or not). Equal counts before and after a piece of work that
 * should leave nothing behind means it left nothing behind. */
long fa_live(void);

#endif
