#!/usr/bin/env python3
"""The include floors of src/atoll: a file may include headers of its own folder or of a lower
floor, never of a higher one, and the folders that share a floor (data, ckpt, dist) never
include one another. Run by ctest (`floors`); exits 1 naming every offending include.

    scripts/check_floors.py [SRC_ROOT]      # default: src/ beside this script's folder
    scripts/check_floors.py --self-test     # proves that an upward include is caught

Bottom up (docs/architecture.md draws them):
    core -> layers -> backend -> model -> config -> optim -> engine
         -> data | ckpt | dist -> train -> supervise -> cli
layers/ is the plain reference that the fast kernels of backend/ are tested against, so it
leans on no kernel; model/ composes layers and kernels into block parts; config/ declares every
key of every section (the [model] struct lives in model/); engine/ runs a step on a device.
"""
import os
import re
import sys
import tempfile

FLOORS = [["core"], ["layers"], ["backend"], ["model"], ["config"], ["optim"], ["engine"],
          ["data", "ckpt", "dist"], ["train"], ["supervise"], ["cli"]]
LEVEL = {part: i for i, parts in enumerate(FLOORS) for part in parts}
# Headers that sit at the root of atoll/ (the generated feature macros) count as core.
ROOT_HEADERS = {"atoll_config.h": "core"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"atoll/([^"]+)"')
SOURCES = (".h", ".cc", ".cu", ".cuh", ".hpp", ".cpp")


def part_of(path_in_atoll):
    head = path_in_atoll.split("/", 1)[0]
    return ROOT_HEADERS.get(head, head)


def check(src_root):
    atoll = os.path.join(src_root, "atoll")
    errors = []
    for dirpath, _, files in os.walk(atoll):
        for name in sorted(files):
            if not name.endswith(SOURCES):
                continue
            path = os.path.relpath(os.path.join(dirpath, name), os.path.dirname(os.path.abspath(src_root)))
            src_part = part_of(os.path.relpath(os.path.join(dirpath, name), atoll))
            if src_part not in LEVEL:
                errors.append(f"{path}: folder '{src_part}' has no floor; add it to FLOORS in {__file__}")
                continue
            with open(os.path.join(dirpath, name), encoding="utf-8", errors="replace") as f:
                for lineno, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    dst_part = part_of(m.group(1))
                    if dst_part == src_part:
                        continue
                    if dst_part not in LEVEL:
                        errors.append(f"{path}:{lineno}: includes atoll/{m.group(1)} of unknown folder '{dst_part}'")
                    elif LEVEL[dst_part] > LEVEL[src_part]:
                        errors.append(f"{path}:{lineno}: {src_part}/ includes atoll/{m.group(1)}, a higher floor "
                                      f"({dst_part}/); move the shared piece down or invert the call")
                    elif LEVEL[dst_part] == LEVEL[src_part]:
                        errors.append(f"{path}:{lineno}: {src_part}/ includes atoll/{m.group(1)}: {src_part}/ and "
                                      f"{dst_part}/ share a floor and stay independent; move the shared piece down")
    return errors


def self_test():
    with tempfile.TemporaryDirectory() as root:
        def write(rel, text):
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        write("atoll/core/a.h", '#include "atoll/atoll_config.h"\n')
        write("atoll/model/m.h", '#include "atoll/core/a.h"\n#include "atoll/layers/l.h"\n')
        write("atoll/layers/l.h", "")
        ok = check(root)
        write("atoll/backend/cuda/k.cu", '#include "atoll/model/m.h"\n')   # up a floor
        write("atoll/dist/d.h", '#include "atoll/ckpt/c.h"\n')             # a sibling
        write("atoll/ckpt/c.h", "")
        bad = check(root)
    assert ok == [], ok
    assert len(bad) == 2 and "higher floor" in bad[0] + bad[1] and "share a floor" in bad[0] + bad[1], bad
    print("check_floors self-test: a clean tree passes; an upward and a sibling include are caught")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return 0
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    errors = check(src)
    for e in errors:
        print(e)
    print(f"include floors: {len(errors)} violation(s)" if errors else "include floors: every include goes down")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
