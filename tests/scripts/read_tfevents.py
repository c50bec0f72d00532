#!/usr/bin/env python3
"""An independent reader of TensorBoard event files, for tests/cli/tensorboard_test.cc.

Reads every events.out.tfevents.* under RUN_DIR (the TFRecord framing, checking both masked
CRC-32C values of every record, and the Event / Summary / Summary.Value protobuf messages of
tensorflow/core/util/event.proto, decoded from the wire format here) and prints one JSON object:
{"files": N, "file_version": "...", "scalars": {tag: {step: value}}}. Exits 1 naming the first
record that is malformed. Shares no code with atoll's writer (src/atoll/core/tensorboard.cc).
"""
import glob, json, struct, sys

POLY = 0x82F63B78
TABLE = []
for n in range(256):
    c = n
    for _ in range(8):
        c = (c >> 1) ^ POLY if c & 1 else c >> 1
    TABLE.append(c)

def crc32c(b):
    c = 0xFFFFFFFF
    for x in b:
        c = TABLE[(c ^ x) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF

def masked(b):
    c = crc32c(b)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF

def varint(b, i):
    v = s = 0
    while True:
        x = b[i]; i += 1; v |= (x & 0x7F) << s; s += 7
        if not x & 0x80:
            return v, i

def fields(b):
    i = 0
    while i < len(b):
        key, i = varint(b, i)
        f, t = key >> 3, key & 7
        if t == 0: v, i = varint(b, i)
        elif t == 1: v = b[i:i + 8]; i += 8
        elif t == 5: v = b[i:i + 4]; i += 4
        elif t == 2: n, i = varint(b, i); v = b[i:i + n]; i += n
        else: raise ValueError(f"wire type {t}")
        yield f, t, v

def main(run):
    if len(sys.argv) > 2 and sys.argv[2] == "--crc":  # the CRC of stdin's bytes, for a vector test
        print(crc32c(sys.stdin.buffer.read())); return 0
    files = sorted(glob.glob(f"{run}/**/events.out.tfevents.*", recursive=True))
    out = {"files": len(files), "file_version": None, "scalars": {}}
    for path in files:
        data = open(path, "rb").read(); i = 0; first = True
        while i < len(data):
            if i + 12 > len(data): print(f"{path}: truncated record header at byte {i}"); return 1
            n, = struct.unpack("<Q", data[i:i + 8]); hc, = struct.unpack("<I", data[i + 8:i + 12])
            if masked(data[i:i + 8]) != hc: print(f"{path}: bad length CRC at byte {i}"); return 1
            if i + 16 + n > len(data): print(f"{path}: truncated record at byte {i}"); return 1
            body = data[i + 12:i + 12 + n]; bc, = struct.unpack("<I", data[i + 12 + n:i + 16 + n])
            if masked(body) != bc: print(f"{path}: bad data CRC at byte {i}"); return 1
            i += 16 + n
            step = 0
            for f, t, v in fields(body):
                if f == 1 and t == 1: struct.unpack("<d", v)
                elif f == 2 and t == 0: step = v
                elif f == 3 and t == 2:
                    if not first: print(f"{path}: file_version after the first record"); return 1
                    out["file_version"] = v.decode()
                elif f == 5 and t == 2:
                    for f2, t2, v2 in fields(v):
                        if f2 != 1 or t2 != 2: continue
                        tag = val = None
                        for f3, t3, v3 in fields(v2):
                            if f3 == 1 and t3 == 2: tag = v3.decode()
                            if f3 == 2 and t3 == 5: val, = struct.unpack("<f", v3)
                        if tag is None or val is None: print(f"{path}: a Value without tag or simple_value"); return 1
                        out["scalars"].setdefault(tag, {})[str(step)] = val
            first = False
    json.dump(out, sys.stdout)
    return 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
