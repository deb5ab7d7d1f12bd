#!/usr/bin/env python3
"""Writes the hostile safetensors corpus: tests/data/hostile/NAME.safetensors.

Every file breaks at least one rule of docs/safetensors.md and must be
rejected as safetensors_invalid (tests/unit/test_safetensors_hostile.c).
Each file stays under 4 KiB so the corpus can be committed; the cases about
huge sizes only write the size fields. Standard library only.

    python3 tests/fuzz/make_hostile.py [OUTPUT_DIR]
"""
import json
import os
import struct
import sys

MAX_FILE = 4096


def u64(n):
    return struct.pack("<Q", n)


def raw(header_bytes, body=b""):
    """Length field, the header bytes as given, then the body."""
    return u64(len(header_bytes)) + header_bytes + body


def hdr(obj):
    """A header serialised the way the safetensors library does it."""
    return json.dumps(obj, separators=(",", ":")).encode()


def entry(dtype="F32", shape=(4,), offsets=(0, 16)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


def one(e, body_len=16, name="x"):
    """A file holding one tensor entry e and body_len bytes of data."""
    return raw(hdr({name: e}), bytes(body_len))


def two(a, b, body_len):
    return raw(hdr({"a": a, "b": b}), bytes(body_len))


def cases():
    c = {}
    # The length field and the framing of the header.
    c["empty_file"] = b""
    c["file_3_bytes"] = b"\x02\x00\x00"
    c["file_7_bytes"] = u64(0)[:7]
    c["header_len_zero"] = u64(0) + b"{}"
    c["header_len_zero_only"] = u64(0)
    c["header_len_over_limit"] = u64(100_000_001) + b"{}      "
    c["header_len_u64_max"] = u64(2**64 - 1) + b"{}      "
    c["header_len_2_63"] = u64(2**63) + b"{}      "
    c["header_len_past_body"] = u64(1000) + hdr({"x": entry()}) + bytes(16)
    c["header_len_one_past_end"] = u64(9) + b"{}      "
    c["header_not_json"] = raw(b"{not json}")
    c["header_truncated_json"] = raw(b'{"x":{"dtype":"F32","shape":[4],')
    c["header_open_brace_only"] = raw(b"{")
    c["header_json_array"] = raw(b"[]")
    c["header_json_string"] = raw(b'"hello"')
    c["header_json_number"] = raw(b"42")
    c["header_leading_space"] = raw(b" {}")
    c["header_leading_bom"] = raw(b"\xef\xbb\xbf{}")
    c["header_trailing_garbage"] = raw(b"{} x")
    c["header_two_objects"] = raw(b"{}{}")
    c["header_nul_inside"] = raw(b'{"x"\x00:' + hdr(entry())[0:] + b"}", bytes(16))
    c["header_nul_padding"] = raw(b"{}\x00\x00\x00\x00\x00\x00")
    c["header_escaped_nul_in_name"] = raw(b'{"a\\u0000b":' + hdr(entry()) + b"}", bytes(16))
    # Text that is not UTF-8, raw or escaped.
    c["name_invalid_utf8"] = raw(b'{"\xff\xfe":' + hdr(entry()) + b"}", bytes(16))
    c["name_overlong_utf8"] = raw(b'{"\xc0\xaf":' + hdr(entry()) + b"}", bytes(16))
    c["name_utf8_surrogate"] = raw(b'{"\xed\xa0\x80":' + hdr(entry()) + b"}", bytes(16))
    c["name_truncated_utf8"] = raw(b'{"\xe2\x82":' + hdr(entry()) + b"}", bytes(16))
    c["name_escaped_lone_surrogate"] = raw(b'{"\\ud800":' + hdr(entry()) + b"}", bytes(16))
    c["metadata_invalid_utf8"] = raw(b'{"__metadata__":{"k":"\xf8\x88\x80\x80\x80"}}')
    # Duplicate names, in the tensors and in the metadata.
    c["duplicate_tensor"] = raw(b'{"x":' + hdr(entry()) + b',"x":' + hdr(entry()) + b"}", bytes(16))
    c["duplicate_metadata"] = raw(b'{"__metadata__":{"a":"1"},"__metadata__":{"a":"1"}}')
    c["duplicate_metadata_key"] = raw(b'{"__metadata__":{"a":"1","a":"2"}}')
    c["duplicate_field_in_entry"] = raw(
        b'{"x":{"dtype":"F32","dtype":"F32","shape":[4],"data_offsets":[0,16]}}', bytes(16))
    # data_offsets.
    c["offsets_negative"] = one(entry(offsets=(-16, 0)))
    c["offsets_negative_end"] = one(entry(offsets=(0, -16)))
    c["offsets_end_before_begin"] = one(entry(offsets=(16, 0)))
    c["offsets_floats"] = raw(b'{"x":{"dtype":"F32","shape":[4],"data_offsets":[0.0,16.0]}}', bytes(16))
    c["offsets_exponent"] = raw(b'{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,1.6e1]}}', bytes(16))
    c["offsets_huge_exponent"] = raw(b'{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,1e400]}}', bytes(16))
    c["offsets_strings"] = one(entry(offsets=("0", "16")))
    c["offsets_null"] = raw(b'{"x":{"dtype":"F32","shape":[4],"data_offsets":null}}', bytes(16))
    c["offsets_object"] = one({"dtype": "F32", "shape": [4], "data_offsets": {"begin": 0, "end": 16}})
    c["offsets_three"] = one(entry(offsets=(0, 16, 32)))
    c["offsets_one"] = one(entry(offsets=(16,)))
    c["offsets_empty"] = one(entry(offsets=()))
    c["offsets_overflow_int64"] = raw(
        b'{"x":{"dtype":"U8","shape":[16],"data_offsets":[0,9223372036854775808]}}', bytes(16))
    c["offsets_int64_max"] = one(entry(dtype="U8", shape=(16,), offsets=(2**63 - 17, 2**63 - 1)))
    c["offsets_past_uint64"] = raw(
        b'{"x":{"dtype":"U8","shape":[16],"data_offsets":[18446744073709551600,18446744073709551616]}}', bytes(16))
    # The layout of the data section.
    c["gap_between_tensors"] = two(entry(), entry(offsets=(20, 36)), 36)
    c["overlap"] = two(entry(), entry(offsets=(8, 24)), 24)
    c["overlap_identical"] = two(entry(), entry(), 16)
    c["overlap_zero_size_inside"] = two(entry(), entry(shape=(0,), offsets=(8, 8)), 16)
    c["first_not_at_zero"] = one(entry(offsets=(4, 20)), body_len=20)
    c["trailing_bytes"] = one(entry(), body_len=20)
    c["trailing_bytes_no_tensors"] = raw(b"{}      ", b"\x00" * 8)
    c["metadata_only_trailing_bytes"] = raw(hdr({"__metadata__": {"a": "b"}}), b"junk")
    c["last_end_past_body"] = one(entry(), body_len=12)
    c["truncated_body"] = two(entry(shape=(2, 4), offsets=(0, 32)), entry(shape=(8,), offsets=(32, 64)), 40)
    c["size_mismatch"] = one(entry(shape=(2, 2), offsets=(0, 12)), body_len=12)
    c["size_mismatch_bf16"] = one(entry(dtype="BF16", shape=(4,), offsets=(0, 16)), body_len=16)
    # Shapes.
    c["shape_negative"] = one(entry(shape=(-1, 4)))
    c["shape_product_overflow"] = one(entry(dtype="U8", shape=(2**32, 2**32)))
    c["shape_product_overflow_3d"] = one(entry(dtype="U8", shape=(2**31, 2**31, 4, 0)))
    c["shape_bytes_overflow"] = one(entry(dtype="F32", shape=(2**61,)))
    c["shape_bytes_overflow_f64"] = one(entry(dtype="F64", shape=(2**60, 1)))
    c["shape_dim_over_int64"] = raw(b'{"x":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,16]}}',
                                    bytes(16))
    c["shape_float"] = raw(b'{"x":{"dtype":"F32","shape":[4.0],"data_offsets":[0,16]}}', bytes(16))
    c["shape_bool"] = one(entry(shape=(True,), offsets=(0, 4)), body_len=4)
    c["shape_not_array"] = one({"dtype": "F32", "shape": 4, "data_offsets": [0, 16]})
    c["shape_nested"] = one({"dtype": "F32", "shape": [[4]], "data_offsets": [0, 16]})
    c["shape_too_many_dims"] = one(entry(shape=(1,) * 9 + (4,)))
    # dtype.
    c["dtype_unknown"] = one(entry(dtype="F128"))
    c["dtype_lowercase"] = one(entry(dtype="f32"))
    c["dtype_trailing_space"] = one(entry(dtype="F32 "))
    c["dtype_empty"] = one(entry(dtype=""))
    c["dtype_not_string"] = one(entry(dtype=32))
    c["dtype_null"] = one(entry(dtype=None))
    # Entry structure.
    c["missing_dtype"] = one({"shape": [4], "data_offsets": [0, 16]})
    c["missing_shape"] = one({"dtype": "F32", "data_offsets": [0, 16]})
    c["missing_data_offsets"] = one({"dtype": "F32", "shape": [4]})
    c["extra_field"] = one(dict(entry(), extra="1"))
    c["entry_not_object"] = one([1, 2])
    c["entry_string"] = one("F32")
    c["entry_empty_object"] = one({})
    # __metadata__.
    c["metadata_not_object"] = raw(hdr({"__metadata__": "format=pt"}))
    c["metadata_array"] = raw(hdr({"__metadata__": ["a", "b"]}))
    c["metadata_value_not_string"] = raw(hdr({"__metadata__": {"k": 1}}))
    c["metadata_value_null"] = raw(hdr({"__metadata__": {"k": None}}))
    c["metadata_value_nested"] = raw(hdr({"__metadata__": {"k": {"a": "b"}}}))
    c["metadata_as_tensor"] = raw(hdr({"__metadata__": entry()}), bytes(16))
    # Deep nesting: past jansson's depth limit (never closed), and closed
    # within it but then not an entry.
    c["deep_nesting_unclosed"] = raw(b'{"x":' + b"[" * 3500)
    c["deep_nesting_closed"] = raw(b'{"x":' + b"[" * 1700 + b"]" * 1700 + b"}")
    c["deep_nesting_objects"] = raw(b'{"x":' + b'{"a":' * 600 + b"1" + b"}" * 600 + b"}")
    return c


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "data", "hostile")
    os.makedirs(out, exist_ok=True)
    c = cases()
    seen = set()
    for name, data in sorted(c.items()):
        if len(data) >= MAX_FILE:
            sys.exit(f"{name}: {len(data)} bytes, over the {MAX_FILE}-byte budget")
        if data in seen:
            sys.exit(f"{name}: same bytes as another case")
        seen.add(data)
        with open(os.path.join(out, name + ".safetensors"), "wb") as f:
            f.write(data)
    print(f"wrote {len(c)} hostile files to {os.path.normpath(out)}")


if __name__ == "__main__":
    main()
