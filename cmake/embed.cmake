# Turns one file into a C source holding its bytes, so that the binary
# serves it without reading the repository at run time.
#   cmake -DIN=file -DOUT=file.c -DSYMBOL=name -P embed.cmake
# defines: const unsigned char name[]; (NUL-terminated) const size_t name_len;
file(READ ${IN} hex HEX)
string(LENGTH "${hex}" hexlen)
math(EXPR len "${hexlen} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
file(WRITE ${OUT} "/* Generated from ${IN} by cmake/embed.cmake: do not edit. */\n"
                  "#include <stddef.h>\n"
                  "const unsigned char ${SYMBOL}[] = {\n${bytes}0x00};\n"
                  "const size_t ${SYMBOL}_len = ${len};\n")
