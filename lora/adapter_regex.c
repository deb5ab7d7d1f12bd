/* A regular-expression engine for the keys of PEFT configs: Python's `re`
 * syntax parsed as sre_parse parses it (the same errors, the same
 * literal '{' rules), compiled to a small program and run as a Pike VM
 * without captures. Only whether a match exists is asked, and that does
 * not depend on greedy or lazy order, so the answer is Python's exactly. */
#include "lora/adapter_regex.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RX_INF (-1)
#define RX_MAX_NODES 4096
#define RX_MAX_PROG 65536
#define RX_MAX_COUNT 1000 /* the largest {m,n} bound taken */

typedef uint8_t rx_set[32]; /* one bit per byte value */

typedef enum { N_SET, N_CAT, N_ALT, N_REP, N_BOL, N_EOL, N_EOS } rx_kind;

typedef struct {
    rx_kind k;
    int set;      /* N_SET: index into sets */
    int min, max; /* N_REP */
    int kid;      /* first child (CAT, ALT, REP), -1 none */
    int next;     /* next sibling, -1 none */
} rx_node;

enum { OP_CHAR, OP_SPLIT, OP_JMP, OP_BOL, OP_EOL, OP_EOS, OP_MATCH };

typedef struct {
    uint8_t op;
    int x, y;
} rx_inst;

struct ls_regex {
    rx_inst *prog;
    int len;
    rx_set *sets;
};

typedef struct {
    const char *p;
    size_t i, n;
    rx_node *nodes;
    int nn;
    rx_set *sets;
    int nsets, cap_sets;
    rx_inst *prog;
    int len;
    char *why;
    size_t why_len;
    bool bad;
} rx_parser;

static void rx_fail(rx_parser *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void rx_fail(rx_parser *ps, const char *fmt, ...) {
    if (ps->bad) return;
    ps->bad = true;
    va_list ap;
    va_start(ap, fmt);
    if (ps->why && ps->why_len) vsnprintf(ps->why, ps->why_len, fmt, ap);
    va_end(ap);
}

static int rx_node_new(rx_parser *ps, rx_kind k) {
    if (ps->nn >= RX_MAX_NODES) {
        rx_fail(ps, "the pattern is too long to evaluate (more than %d items)", RX_MAX_NODES);
        return -1;
    }
    rx_node *nd = &ps->nodes[ps->nn];
    *nd = (rx_node){.k = k, .kid = -1, .next = -1};
    return ps->nn++;
}

/* A new empty set; -1 on failure (reported). */
static int rx_set_new(rx_parser *ps) {
    if (ps->nsets == ps->cap_sets) {
        int cap = ps->cap_sets ? 2 * ps->cap_sets : 16;
        rx_set *s = realloc(ps->sets, (size_t)cap * sizeof *s);
        if (!s) {
            rx_fail(ps, "out of memory");
            return -1;
        }
        ps->sets = s;
        ps->cap_sets = cap;
    }
    memset(ps->sets[ps->nsets], 0, sizeof(rx_set));
    return ps->nsets++;
}

static void rx_set_add(rx_set s, int lo, int hi) {
    for (int c = lo; c <= hi; c++) s[c >> 3] |= (uint8_t)(1u << (c & 7));
}

/* A set node holding [lo, hi], or the category or literal the caller adds. */
static int rx_set_node(rx_parser *ps, int *set_out) {
    int s = rx_set_new(ps), nd = s < 0 ? -1 : rx_node_new(ps, N_SET);
    if (nd < 0) return -1;
    ps->nodes[nd].set = s;
    *set_out = s;
    return nd;
}

static int rx_peek(const rx_parser *ps) { return ps->i < ps->n ? (unsigned char)ps->p[ps->i] : -1; }

/* The ASCII members of Python's str categories \d, \w, \s into s. */
static void rx_category(rx_set s, int letter) {
    rx_set c = {0};
    switch (letter | 0x20) {
    case 'd':
        rx_set_add(c, '0', '9');
        break;
    case 'w':
        rx_set_add(c, '0', '9'), rx_set_add(c, 'A', 'Z'), rx_set_add(c, 'a', 'z'), rx_set_add(c, '_', '_');
        break;
    default: /* 's': str.isspace() of the ASCII characters */
        rx_set_add(c, '\t', '\r'), rx_set_add(c, 0x1c, 0x20);
        break;
    }
    /* Upper case is the complement within ASCII; text is ASCII-only. */
    const bool neg = letter >= 'A' && letter <= 'Z';
    for (int i = 0; i < 16; i++) s[i] |= neg ? (uint8_t)~c[i] : c[i];
}

/* The literal an escape letter stands for, -1 when it is none. */
static int rx_escape_literal(int c, bool in_set) {
    switch (c) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case 'a': return '\a';
    case 'b': return in_set ? '\b' : -1;
    default: break;
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return -1;
    return c; /* any other ASCII character escapes to itself */
}

/* After a backslash: adds what it names into s (a set) and returns 1, or
 * returns 0 for an anchor (*anchor set) outside sets; -1 on failure. */
static int rx_escape(rx_parser *ps, rx_set s, bool in_set, rx_kind *anchor) {
    int c = rx_peek(ps);
    if (c < 0) {
        rx_fail(ps, "bad escape (end of pattern)");
        return -1;
    }
    ps->i++;
    if (strchr("dDwWsS", c)) {
        rx_category(s, c);
        return 1;
    }
    if (!in_set && (c == 'A' || c == 'Z')) {
        *anchor = c == 'A' ? N_BOL : N_EOS;
        return 0;
    }
    int lit = rx_escape_literal(c, in_set);
    if (lit >= 0) {
        rx_set_add(s, lit, lit);
        return 1;
    }
    if (c >= '0' && c <= '9')
        rx_fail(ps, "back-references and octal escapes (\\%c at %zu) are not supported", c, ps->i - 2);
    else if (c == 'b' || c == 'B')
        rx_fail(ps, "word boundaries (\\%c at %zu) are not supported", c, ps->i - 2);
    else if (c == 'x' || c == 'u' || c == 'U' || c == 'N')
        rx_fail(ps, "character code escapes (\\%c at %zu) are not supported", c, ps->i - 2);
    else
        rx_fail(ps, "bad escape \\%c at %zu", c, ps->i - 2);
    return -1;
}

/* One member of a set: a literal byte (*lit) or a category (*lit -1). */
static bool rx_set_item(rx_parser *ps, int c, rx_set s, int *lit) {
    *lit = -1;
    if (c != '\\') {
        *lit = c;
        return true;
    }
    rx_set one = {0};
    rx_kind anchor;
    if (rx_escape(ps, one, true, &anchor) < 0) return false;
    int count = 0, only = -1;
    for (int b = 0; b < 256; b++)
        if (one[b >> 3] & (1u << (b & 7))) count++, only = b;
    const int e = (unsigned char)ps->p[ps->i - 1];
    if (count == 1 && !strchr("dDwWsS", e)) *lit = only;
    else for (int i = 0; i < 32; i++) s[i] |= one[i];
    return true;
}

/* [...] after its '[': sre_parse's rules (']' first is literal, '-' last
 * is literal, ranges only between literals). */
static int rx_parse_set(rx_parser *ps) {
    int si, nd = rx_set_node(ps, &si);
    if (nd < 0) return -1;
    rx_set s = {0};
    const size_t open = ps->i - 1;
    bool neg = false, any = false;
    if (rx_peek(ps) == '^') neg = true, ps->i++;
    for (;;) {
        int c = rx_peek(ps);
        if (c < 0) {
            rx_fail(ps, "unterminated character set at %zu", open);
            return -1;
        }
        ps->i++;
        if (c == ']' && any) break;
        any = true;
        int lo;
        if (!rx_set_item(ps, c, s, &lo)) return -1;
        if (rx_peek(ps) == '-' && ps->i + 1 < ps->n && ps->p[ps->i + 1] != ']') {
            ps->i++;
            int c2 = rx_peek(ps), hi;
            ps->i++;
            if (!rx_set_item(ps, c2, s, &hi)) return -1;
            if (lo < 0 || hi < 0 || hi < lo) {
                rx_fail(ps, "bad character range at %zu", ps->i - 3);
                return -1;
            }
            rx_set_add(s, lo, hi);
        } else if (lo >= 0) {
            rx_set_add(s, lo, lo);
        }
    }
    for (int i = 0; i < 32; i++) ps->sets[si][i] = neg ? (uint8_t)~s[i] : s[i];
    return nd;
}

/* The decimal number at ps->p[*j] (advancing *j past its digits), held
 * at RX_MAX_COUNT + 1 once it passes RX_MAX_COUNT so that no count of
 * digits can overflow; -1 when there are none. */
static long rx_count(const rx_parser *ps, size_t *j) {
    long v = -1;
    for (; *j < ps->n && ps->p[*j] >= '0' && ps->p[*j] <= '9'; (*j)++) {
        v = (v < 0 ? 0 : v) * 10 + (ps->p[*j] - '0');
        if (v > RX_MAX_COUNT) v = RX_MAX_COUNT + 1;
    }
    return v;
}

/* A {m}, {m,}, {,n}, {m,n} quantifier at ps->i (which is '{')? Python
 * reads anything else as a literal '{'. Advances past it when it is. */
static bool rx_braces(rx_parser *ps, int *min, int *max) {
    size_t j = ps->i + 1;
    long lo, hi = -1;
    bool comma = false;
    if (j < ps->n && ps->p[j] == '}') return false;
    lo = rx_count(ps, &j);
    if (j < ps->n && ps->p[j] == ',') {
        comma = true;
        j++;
        hi = rx_count(ps, &j);
    } else {
        hi = lo;
    }
    if (j >= ps->n || ps->p[j] != '}') return false;
    ps->i = j + 1;
    *min = lo < 0 ? 0 : (lo > RX_MAX_COUNT ? RX_MAX_COUNT + 1 : (int)lo);
    *max = hi < 0 ? (comma ? RX_INF : *min) : (hi > RX_MAX_COUNT ? RX_MAX_COUNT + 1 : (int)hi);
    if (*min > RX_MAX_COUNT || *max > RX_MAX_COUNT)
        rx_fail(ps, "repeat counts above %d are not supported", RX_MAX_COUNT);
    else if (*max != RX_INF && *max < *min)
        rx_fail(ps, "min repeat greater than max repeat");
    return true;
}

/* A quantifier at ps->i? Sets min and max and advances past it. */
static bool rx_quantifier(rx_parser *ps, int *min, int *max) {
    int c = rx_peek(ps);
    if (c == '*') *min = 0, *max = RX_INF;
    else if (c == '+') *min = 1, *max = RX_INF;
    else if (c == '?') *min = 0, *max = 1;
    else if (c == '{') return rx_braces(ps, min, max);
    else return false;
    ps->i++;
    return true;
}

static int rx_parse_alt(rx_parser *ps, int depth);

/* (...) after its '(': plain, (?:...) or (?P<name>...). */
static int rx_parse_group(rx_parser *ps, int depth) {
    const size_t open = ps->i - 1;
    if (rx_peek(ps) == '?') {
        ps->i++;
        int c = rx_peek(ps);
        if (c == ':') {
            ps->i++;
        } else if (c == 'P' && ps->i + 1 < ps->n && ps->p[ps->i + 1] == '<') {
            size_t j = ps->i + 2;
            while (j < ps->n && (ps->p[j] == '_' || (ps->p[j] >= 'a' && ps->p[j] <= 'z') ||
                                 (ps->p[j] >= 'A' && ps->p[j] <= 'Z') || (ps->p[j] >= '0' && ps->p[j] <= '9')))
                j++;
            if (j == ps->i + 2 || j >= ps->n || ps->p[j] != '>' || (ps->p[ps->i + 2] >= '0' && ps->p[ps->i + 2] <= '9')) {
                rx_fail(ps, "bad group name at %zu", open);
                return -1;
            }
            ps->i = j + 1;
        } else {
            rx_fail(ps, "the group construct (?%c at %zu is not supported (look-arounds, flags, atomic groups, "
                        "references)", c < 0 ? ' ' : c, open);
            return -1;
        }
    }
    int nd = rx_parse_alt(ps, depth + 1);
    if (nd < 0) return -1;
    if (rx_peek(ps) != ')') {
        rx_fail(ps, "missing ), unterminated subpattern at %zu", open);
        return -1;
    }
    ps->i++;
    return nd;
}

/* One atom (without its quantifier); *is_anchor for ^, $, \A, \Z. */
static int rx_parse_atom(rx_parser *ps, int depth, bool *is_anchor) {
    *is_anchor = false;
    int c = rx_peek(ps), si, nd;
    int min, max;
    size_t at = ps->i;
    if (c == '*' || c == '+' || c == '?' || (c == '{' && rx_braces(ps, &min, &max))) {
        rx_fail(ps, "nothing to repeat at %zu", at);
        return -1;
    }
    ps->i++;
    switch (c) {
    case '(':
        return rx_parse_group(ps, depth);
    case '[':
        return rx_parse_set(ps);
    case '^':
    case '$':
        *is_anchor = true;
        return rx_node_new(ps, c == '^' ? N_BOL : N_EOL);
    case '.':
        if ((nd = rx_set_node(ps, &si)) >= 0) {
            rx_set_add(ps->sets[si], 0, '\n' - 1);
            rx_set_add(ps->sets[si], '\n' + 1, 255);
        }
        return nd;
    case '\\': {
        rx_set s = {0};
        rx_kind anchor;
        int r = rx_escape(ps, s, false, &anchor);
        if (r < 0) return -1;
        if (r == 0) {
            *is_anchor = true;
            return rx_node_new(ps, anchor);
        }
        if ((nd = rx_set_node(ps, &si)) >= 0) memcpy(ps->sets[si], s, sizeof s);
        return nd;
    }
    default:
        if ((nd = rx_set_node(ps, &si)) >= 0) rx_set_add(ps->sets[si], c, c);
        return nd;
    }
}

/* A sequence up to '|', ')' or the end, each atom with its quantifier. */
static int rx_parse_cat(rx_parser *ps, int depth) {
    int cat = rx_node_new(ps, N_CAT), last = -1;
    while (cat >= 0 && !ps->bad && ps->i < ps->n && rx_peek(ps) != '|' && rx_peek(ps) != ')') {
        bool anchor;
        int atom = rx_parse_atom(ps, depth, &anchor), min, max;
        if (atom < 0) return -1;
        size_t at = ps->i;
        if (rx_quantifier(ps, &min, &max)) {
            if (ps->bad) return -1;
            if (anchor) {
                rx_fail(ps, "nothing to repeat at %zu", at);
                return -1;
            }
            int rep = rx_node_new(ps, N_REP);
            if (rep < 0) return -1;
            ps->nodes[rep].min = min, ps->nodes[rep].max = max, ps->nodes[rep].kid = atom;
            atom = rep;
            if (rx_peek(ps) == '?') ps->i++; /* lazy: the same matches exist */
            else if (rx_peek(ps) == '+') {
                rx_fail(ps, "possessive quantifiers (at %zu) are not supported", ps->i);
                return -1;
            }
            if (rx_quantifier(ps, &min, &max)) {
                rx_fail(ps, "multiple repeat at %zu", at);
                return -1;
            }
        }
        if (last < 0) ps->nodes[cat].kid = atom;
        else ps->nodes[last].next = atom;
        last = atom;
    }
    return ps->bad ? -1 : cat;
}

static int rx_parse_alt(rx_parser *ps, int depth) {
    if (depth > 100) {
        rx_fail(ps, "groups are nested too deeply");
        return -1;
    }
    int alt = rx_node_new(ps, N_ALT), last = -1;
    for (;;) {
        int cat = alt < 0 ? -1 : rx_parse_cat(ps, depth);
        if (cat < 0) return -1;
        if (last < 0) ps->nodes[alt].kid = cat;
        else ps->nodes[last].next = cat;
        last = cat;
        if (rx_peek(ps) != '|') return alt;
        ps->i++;
    }
}

static int rx_emit(rx_parser *ps, uint8_t op, int x, int y) {
    if (ps->len >= RX_MAX_PROG) {
        rx_fail(ps, "the pattern is too large to evaluate");
        return -1;
    }
    ps->prog[ps->len] = (rx_inst){op, x, y};
    return ps->len++;
}

static void rx_gen(rx_parser *ps, int nd);

static void rx_gen_rep(rx_parser *ps, const rx_node *n) {
    for (int i = 0; i < n->min && !ps->bad; i++) rx_gen(ps, n->kid);
    if (n->max == RX_INF) {
        int split = rx_emit(ps, OP_SPLIT, 0, 0);
        if (split < 0) return;
        ps->prog[split].x = split + 1;
        rx_gen(ps, n->kid);
        rx_emit(ps, OP_JMP, split, 0);
        if (!ps->bad) ps->prog[split].y = ps->len;
        return;
    }
    int splits = -1; /* chained through the y fields until the end is known */
    for (int i = n->min; i < n->max && !ps->bad; i++) {
        int split = rx_emit(ps, OP_SPLIT, 0, splits);
        if (split < 0) return;
        ps->prog[split].x = split + 1;
        splits = split;
        rx_gen(ps, n->kid);
    }
    while (!ps->bad && splits >= 0) {
        int prev = ps->prog[splits].y;
        ps->prog[splits].y = ps->len;
        splits = prev;
    }
}

/* Emits nd; alternatives patch their jumps to the end of the whole. */
static void rx_gen(rx_parser *ps, int nd) {
    if (ps->bad) return;
    const rx_node *n = &ps->nodes[nd];
    switch (n->k) {
    case N_SET:
        rx_emit(ps, OP_CHAR, n->set, 0);
        break;
    case N_BOL:
    case N_EOL:
    case N_EOS:
        rx_emit(ps, n->k == N_BOL ? OP_BOL : n->k == N_EOL ? OP_EOL : OP_EOS, 0, 0);
        break;
    case N_CAT:
        for (int k = n->kid; k >= 0 && !ps->bad; k = ps->nodes[k].next) rx_gen(ps, k);
        break;
    case N_REP:
        rx_gen_rep(ps, n);
        break;
    case N_ALT: {
        int jumps = -1; /* chained through the y fields of the JMPs */
        for (int k = n->kid; k >= 0 && !ps->bad; k = ps->nodes[k].next) {
            if (ps->nodes[k].next < 0) {
                rx_gen(ps, k);
                break;
            }
            int split = rx_emit(ps, OP_SPLIT, 0, 0);
            if (split < 0) return;
            ps->prog[split].x = split + 1;
            rx_gen(ps, k);
            int j = rx_emit(ps, OP_JMP, 0, jumps);
            if (j < 0) return;
            jumps = j;
            ps->prog[split].y = ps->len;
        }
        while (!ps->bad && jumps >= 0) {
            int prev = ps->prog[jumps].y;
            ps->prog[jumps].x = ps->len, ps->prog[jumps].y = 0;
            jumps = prev;
        }
        break;
    }
    }
}

bool ls_regex_compile(const char *pattern, ls_regex **out, char *why, size_t why_len) {
    *out = NULL;
    if (why && why_len) why[0] = '\0';
    rx_parser ps = {.p = pattern, .n = strlen(pattern), .why = why, .why_len = why_len};
    for (size_t i = 0; i < ps.n; i++)
        if ((unsigned char)pattern[i] >= 0x80) {
            rx_fail(&ps, "non-ASCII characters are not supported");
            return false;
        }
    ps.nodes = malloc(RX_MAX_NODES * sizeof *ps.nodes);
    ps.prog = malloc(RX_MAX_PROG * sizeof *ps.prog);
    ls_regex *re = calloc(1, sizeof *re);
    if (!ps.nodes || !ps.prog || !re) rx_fail(&ps, "out of memory");
    int root = ps.bad ? -1 : rx_parse_alt(&ps, 0);
    if (root >= 0 && ps.i < ps.n) rx_fail(&ps, "unbalanced parenthesis at %zu", ps.i);
    if (!ps.bad) rx_gen(&ps, root);
    if (!ps.bad) rx_emit(&ps, OP_MATCH, 0, 0);
    free(ps.nodes);
    if (ps.bad) {
        free(ps.prog);
        free(ps.sets);
        free(re);
        return false;
    }
    rx_inst *prog = realloc(ps.prog, (size_t)ps.len * sizeof *prog);
    re->prog = prog ? prog : ps.prog;
    re->len = ps.len;
    re->sets = ps.sets;
    *out = re;
    return true;
}

typedef struct {
    int *pcs;
    int n;
} rx_list;

/* Adds pc and what it reaches without consuming; true when that reaches
 * the match (re.match needs no more). stack and mark are len long. */
static bool rx_add(const ls_regex *re, rx_list *l, int pc, size_t pos, const char *s, size_t n, unsigned *mark,
                   unsigned gen, int *stack) {
    int top = 0;
    stack[top++] = pc;
    while (top) {
        int p = stack[--top];
        if (mark[p] == gen) continue;
        mark[p] = gen;
        const rx_inst *in = &re->prog[p];
        switch (in->op) {
        case OP_MATCH:
            return true;
        case OP_CHAR:
            l->pcs[l->n++] = p;
            break;
        case OP_JMP:
            stack[top++] = in->x;
            break;
        case OP_SPLIT:
            stack[top++] = in->y;
            stack[top++] = in->x;
            break;
        case OP_BOL:
            if (pos == 0) stack[top++] = p + 1;
            break;
        case OP_EOL: /* Python's $: the end, or before a newline that ends the text */
            if (pos == n || (pos + 1 == n && s[pos] == '\n')) stack[top++] = p + 1;
            break;
        default: /* OP_EOS */
            if (pos == n) stack[top++] = p + 1;
            break;
        }
    }
    return false;
}

int ls_regex_match(const ls_regex *re, const char *s) {
    const size_t n = strlen(s);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return -1;
    const size_t L = (size_t)re->len;
    /* Two lists of at most L states, and a stack for the epsilon closure:
     * each state is pushed at most once per edge into it (two at most). */
    int *buf = malloc((4 * L + 1) * sizeof(int));
    unsigned *mark = calloc(L, sizeof *mark);
    if (!buf || !mark) {
        free(buf);
        free(mark);
        return -1;
    }
    rx_list cur = {buf, 0}, nxt = {buf + L, 0};
    int *stack = buf + 2 * L;
    unsigned gen = 1;
    int found = rx_add(re, &cur, 0, 0, s, n, mark, gen, stack);
    for (size_t pos = 0; !found && pos < n && cur.n; pos++) {
        const unsigned char c = (unsigned char)s[pos];
        gen++;
        nxt.n = 0;
        for (int i = 0; i < cur.n && !found; i++) {
            const rx_inst *in = &re->prog[cur.pcs[i]];
            if (re->sets[in->x][c >> 3] & (1u << (c & 7)))
                found = rx_add(re, &nxt, cur.pcs[i] + 1, pos + 1, s, n, mark, gen, stack);
        }
        rx_list t = cur;
        cur = nxt;
        nxt = t;
    }
    free(buf);
    free(mark);
    return found ? 1 : 0;
}

void ls_regex_free(ls_regex *re) {
    if (!re) return;
    free(re->prog);
    free(re->sets);
    free(re);
}
