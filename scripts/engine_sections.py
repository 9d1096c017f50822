#!/usr/bin/python3
"""engine_sections.py — compares named sections of two engine files byte for byte.

    engine_sections.py A.engine B.engine [SECTION ...]   (default: graph weights)

Prints one line per section (size, equal or the first differing byte) and
exits 1 when any differs. The layout is src/plan/engine.h's: a 64-byte header
(magic, u32 version, u32 section count, ...), then 48-byte table entries
(name[24], u64 offset, u64 size, u64 checksum).
"""
import struct
import sys


def sections(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"TBENGINE":
        sys.exit(f"{path}: not an engine file")
    _, count = struct.unpack_from("<II", data, 8)
    out = {}
    for i in range(count):
        name, off, size, _ = struct.unpack_from("<24sQQQ", data, 64 + 48 * i)
        out[name.rstrip(b"\0").decode()] = data[off:off + size]
    return out


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__.split("\n\n")[1])
    a, b = sections(sys.argv[1]), sections(sys.argv[2])
    bad = 0
    for name in sys.argv[3:] or ["graph", "weights"]:
        x, y = a.get(name), b.get(name)
        if x is None or y is None:
            print(f"{name}: missing in {'the first' if x is None else 'the second'} engine")
            bad = 1
        elif x == y:
            print(f"{name}: {len(x)} bytes, identical")
        else:
            at = next((i for i in range(min(len(x), len(y))) if x[i] != y[i]), min(len(x), len(y)))
            print(f"{name}: differ ({len(x)} vs {len(y)} bytes, first at byte {at})")
            bad = 1
    sys.exit(bad)


if __name__ == "__main__":
    main()
