#!/usr/bin/env python3
"""Runs the commands that README.md and the pages of docs/ document, as written, from the
repository root, so the docs cannot drift from what atoll does. CI calls it from .ci/run after
scripts/setup.sh.

    scripts/check_readme_commands.py [--steps N] [--list] [--links] [--self-test]

It reads every command line of the pages' indented code blocks (lines that start with
`build/` or `scripts/`, `\\` continuations joined, `# comments` dropped): README.md first, then
docs/*.md in name order, all in one working tree, so a page may use what README.md's commands
made (runs/tiny). docs/history.md is not read: it keeps superseded figures and their commands
verbatim. It runs each command, in order, with these rules, which the README itself states:
  - a command that trains (`atoll train`, `launch`, `worker`) gets `--set train.steps=N`
    appended (default 40), to stay within a few minutes on 2 cores;
  - `atoll bench` gets `--steps 1 --warmup 0` where it sets neither: the check is that it runs,
    the figures are docs/benchmarks.md's (3 timed steps of configs/small.toml are ~30 s in CI);
  - `my_texts/` and `notes.jsonl` stand for the user's files: it writes them first (fortunes
    as text files, and as JSON lines with a "text" field);
  - `atoll worker`'s blanks (HOST:6379, I, R, N, cfg.toml) are filled with a redis-server it
    starts on loopback, two islands (I = 0 and 1, run at once), rank 0 and configs/tiny.toml;
  - the test-suite command (`ctest`), `scripts/build_gpu.sh` and `scripts/gpu_kit.sh` are
    listed but not run: .ci/run runs them itself;
  - a page that holds the line `<!-- commands: listed, not run: REASON -->` has its commands
    listed and checked as written out, but not run (docs/benchmarks.md: measurements that take
    minutes to hours); so has one command whose comment says `# listed, not run: REASON`.
A command with an elided part (`...`) or an unknown blank is an error: write it out.
`--links` checks that every relative link and image of those pages (and of docs/history.md)
names a file or folder that exists.

Prepared data goes to a fresh ATOLL_CACHE_DIR (a newcomer's empty cache). It refuses to start
when a path the commands write already exists (move it away first), and removes what it
created at the end. Exits non-zero, naming the command and showing its output, when any fails.
"""
import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAINING = {"train", "launch", "worker"}
NOT_RUN = {
    "ctest": "the test suite itself: .ci/run runs this command last",
    "scripts/build_gpu.sh": "the GPU builds: .ci/run runs them",
    "scripts/gpu_kit.sh": "the GPU kit: .ci/run builds it and runs scripts/check_gpu_kit.sh",
}
FORTUNES = Path("/usr/share/games/fortunes")
TIMEOUT_S = 900
HISTORY = "docs/history.md"  # superseded figures and their commands, kept verbatim: not read
PAGE_NOT_RUN = re.compile(r"^<!--\s*commands: listed, not run: (.+?)\s*-->\s*$", re.M)
LINE_NOT_RUN = re.compile(r"#\s*listed, not run: (.+)$")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def pages():
    """The pages whose commands are checked, in the order they run: README.md, then docs/."""
    return ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")
                                  if str(p.relative_to(ROOT)) != HISTORY)


def page_commands(text):
    """Each documented command of a page as (argv parts split at `&&`, reason it is not run or
    None), in page order. The reason comes from the page's or the command's marker."""
    page_reason = PAGE_NOT_RUN.search(text)
    commands, pending = [], ""
    for line in text.splitlines():
        if not line.startswith("    "):
            pending = ""
            continue
        text = line.strip()
        if not pending and not text.startswith(("build/", "scripts/")):
            continue
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        marker = LINE_NOT_RUN.search(pending + text)
        words = shlex.split(pending + text, comments=True)
        pending = ""
        parts, part = [], []
        for w in words:
            if w == "&&":
                parts.append(part)
                part = []
            else:
                part.append(w)
        parts.append(part)
        reason = marker.group(1).strip() if marker else page_reason.group(1) if page_reason else None
        commands.append((parts, reason))
    return commands


def readme_commands(text):
    """Each documented command of a page as a list of argv parts (split at `&&`), in page order."""
    return [parts for parts, _ in page_commands(text)]


def all_commands():
    """(page, parts, reason not run or None) for every command of every checked page."""
    out = []
    for page in pages():
        for parts, reason in page_commands((ROOT / page).read_text()):
            out.append((page, parts, reason or not_run_reason(parts)))
    return out


def broken_links(page, text):
    """The relative links and images of a page that name nothing in the tree."""
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue  # a URL (https:, mailto:) or an anchor of the page itself
        path = target.split("#")[0]
        if not (ROOT / page).parent.joinpath(path).exists():
            broken.append(target)
    return broken


def check_links():
    bad = [f"{page}: ({t})" for page in pages() + [HISTORY] if (ROOT / page).is_file()
           for t in broken_links(page, (ROOT / page).read_text())]
    if bad:
        print("check_readme_commands: links that name no file:\n  " + "\n  ".join(bad))
        return 1
    print(f"check_readme_commands: every relative link resolves ({len(pages()) + 1} pages)")
    return 0


def describe(parts):
    return " && ".join(shlex.join(p) for p in parts)


def atoll_subcommand(part):
    return part[1] if len(part) > 1 and part[0] == "build/atoll" else None


def shortened(part, steps):
    """The command as the check runs it: fewer steps for what trains or benchmarks."""
    if "--help-config" in part or "--help" in part:
        return part
    if atoll_subcommand(part) in TRAINING:
        return part + ["--set", f"train.steps={steps}"]
    if atoll_subcommand(part) == "bench" and "--steps" not in part and "--warmup" not in part:
        return part + ["--steps", "1", "--warmup", "0"]
    return part


def not_run_reason(parts):
    for p in parts:
        for key, reason in NOT_RUN.items():
            if p and p[0] == key:
                return reason
    return None


def written_paths(commands):
    """Paths the commands create: run directories, outputs, the user's inputs."""
    paths = {"my_texts", "notes.jsonl"}
    for parts in commands:
        for p in parts:
            for flag in ("--run-dir", "--out"):
                if flag in p and p.index(flag) + 1 < len(p):
                    paths.add(p[p.index(flag) + 1].rstrip("/"))
    return sorted(paths)


def write_user_inputs():
    texts = ROOT / "my_texts"
    texts.mkdir()
    for name in ("art", "computers", "cookie", "definitions", "education", "food", "fortunes", "humorists",
                 "law", "linux", "literature", "love", "magic", "medicine", "miscellaneous", "news", "people",
                 "pets", "platitudes", "politics", "riddles", "science", "songs-poems", "sports", "startrek",
                 "wisdom", "work", "zippy"):
        if (FORTUNES / name).is_file():
            shutil.copyfile(FORTUNES / name, texts / f"{name}.txt")
    with open(ROOT / "notes.jsonl", "w") as out:
        for text in (FORTUNES / "debian").read_text(errors="replace").split("\n%\n"):
            out.write(json.dumps({"text": text}) + "\n")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, proc, timeout_s=30):
    """Until something accepts connections on the loopback port (the store is up)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"check_readme_commands: redis-server on port {port} did not start")


def fill_worker_blanks(part, store, island):
    blanks = {"redis://HOST:6379": store, "I": str(island), "R": "0", "N": "2", "cfg.toml": "configs/tiny.toml"}
    filled = [blanks.get(w, w) for w in part]
    left = [w for w in filled if w.isupper() or "HOST" in w]
    if left:
        raise SystemExit(f"check_readme_commands: unknown blank {left} in {shlex.join(part)}: "
                         "fill it in scripts/check_readme_commands.py or write the command out")
    return filled


def run(argvs, env, log):
    """Runs the argv lists at once (one process each); returns (ok, seconds)."""
    start = time.monotonic()
    procs = []
    for a in argvs:
        try:
            procs.append(subprocess.Popen(a, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
        except OSError as e:
            log.write(f"{shlex.join(a)}: {e}\n")
            return False, time.monotonic() - start
    ok = True
    for p in procs:
        try:
            ok = p.wait(timeout=TIMEOUT_S) == 0 and ok
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            ok = False
    return ok, time.monotonic() - start


def check_written_out(commands, page="README.md"):
    """Every command complete: no elided part, no blank the check cannot fill."""
    for parts in commands:
        if any("..." in w for p in parts for w in p):
            raise SystemExit(f"check_readme_commands: {page} elides part of `{describe(parts)}`: write it out")
        for p in parts:
            if atoll_subcommand(p) == "worker":
                fill_worker_blanks(p, "redis://127.0.0.1:1", 0)


def self_test():
    """The checker itself catches what it must: it parses continuations, comments and `&&`,
    refuses an elided command and an unknown blank, shortens what trains or benchmarks, reads the
    listed-only markers, finds a broken relative link, and reports a failing command as failed."""
    text = ("prose\n\n    build/atoll train --config a.toml \\\n        --set x=1   # comment\n"
            "    scripts/setup.sh && build/atoll eval --checkpoint runs/x\n    not a command\n")
    assert readme_commands(text) == [[["build/atoll", "train", "--config", "a.toml", "--set", "x=1"]],
                                     [["scripts/setup.sh"], ["build/atoll", "eval", "--checkpoint", "runs/x"]]]
    for bad in ("    build/atoll launch --islands 2 ...\n", "    build/atoll worker --store redis://HOST:1 --rank Q\n"):
        try:
            check_written_out(readme_commands(bad))
        except SystemExit:
            continue
        raise AssertionError(f"not refused: {bad!r}")
    marked = "    build/atoll bench --config a.toml   # listed, not run: takes an hour\n    build/atoll eval --checkpoint x\n"
    assert page_commands(marked) == [([["build/atoll", "bench", "--config", "a.toml"]], "takes an hour"),
                                     ([["build/atoll", "eval", "--checkpoint", "x"]], None)]
    page = "# Figures\n<!-- commands: listed, not run: measurements -->\n\n" + marked
    assert [r for _, r in page_commands(page)] == ["takes an hour", "measurements"]
    assert shortened(["build/atoll", "bench", "--config", "a.toml"], 40)[-4:] == ["--steps", "1", "--warmup", "0"]
    assert shortened(["build/atoll", "bench", "--steps", "3"], 40) == ["build/atoll", "bench", "--steps", "3"]
    assert shortened(["build/atoll", "train"], 7) == ["build/atoll", "train", "--set", "train.steps=7"]
    assert shortened(["build/atoll", "train", "--help"], 7) == ["build/atoll", "train", "--help"]
    links = "[a](README.md) ![b](docs/no-such.png) [c](https://x.org/y) [d](#here) [e](docs/#x) [f](nope.md#a)"
    assert broken_links("README.md", links) == ["docs/no-such.png", "nope.md#a"]
    with tempfile.TemporaryFile("w+") as log:
        assert run([["scripts/no-such-script.sh"]], dict(os.environ), log)[0] is False
        assert run([["false"]], dict(os.environ), log)[0] is False
        assert run([["true"]], dict(os.environ), log)[0] is True
    print("check_readme_commands: self-test passed")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=40, help="train.steps for the commands that train")
    ap.add_argument("--list", action="store_true", help="list the commands and what would run, run nothing")
    ap.add_argument("--links", action="store_true", help="check the pages' relative links, run nothing")
    ap.add_argument("--self-test", action="store_true", help="check the checker on made-up commands")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    if args.links:
        return check_links()

    commands = all_commands()
    for page in pages():
        check_written_out([parts for p, parts, _ in commands if p == page], page)
    if args.list:
        for page, parts, reason in commands:
            print(f"{page}: " + (f"not run ({reason}): " if reason else "") + describe(parts))
        return 0
    if not (ROOT / "build/atoll").is_file():
        raise SystemExit("check_readme_commands: no build/atoll; fix: run scripts/setup.sh first")
    existing = [p for p in written_paths(parts for _, parts, reason in commands if not reason) if (ROOT / p).exists()]
    if existing:
        raise SystemExit(f"check_readme_commands: {', '.join(existing)} already exist in {ROOT}; the docs' "
                         "commands would write there; fix: move them away and run again")

    # What existed before, so that only what the commands add is removed afterwards.
    before = {d: set(os.listdir(ROOT / d)) if (ROOT / d).is_dir() else None for d in ("runs", "data", "exports")}
    cache = tempfile.mkdtemp(prefix="atoll-readme-cache-")
    env = dict(os.environ, ATOLL_CACHE_DIR=cache)
    redis = None
    failed = []
    page_seconds = {}
    try:
        write_user_inputs()
        for page, parts, reason in commands:
            title = describe(parts)
            if reason:
                print(f"-- not run ({reason}) [{page}]: {title}", flush=True)
                continue
            parts = [shortened(p, args.steps) for p in parts]
            with tempfile.TemporaryFile("w+") as log:
                ok, seconds = True, 0.0
                for p in parts:
                    if atoll_subcommand(p) == "worker":
                        if redis is None:
                            port = free_port()
                            redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                                                      "--save", "", "--appendonly", "no"],
                                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                            wait_for_port(port, redis)
                        argvs = [fill_worker_blanks(p, f"redis://127.0.0.1:{port}", i) for i in (0, 1)]
                    else:
                        argvs = [p]
                    ok, s = run(argvs, env, log)
                    seconds += s
                    if not ok:
                        break
                page_seconds[page] = page_seconds.get(page, 0.0) + seconds
                status = "ok" if ok else "FAILED"
                print(f"-- {status} ({seconds:.0f} s) [{page}]: {describe(parts)}", flush=True)
                if not ok:
                    log.seek(0)
                    print("".join(log.readlines()[-40:]), flush=True)
                    failed.append(f"{page}: {title}")
    finally:
        if redis is not None:
            redis.send_signal(signal.SIGTERM)
            redis.wait()
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(ROOT / "my_texts", ignore_errors=True)
        (ROOT / "notes.jsonl").unlink(missing_ok=True)
        for d, names in before.items():
            if not (ROOT / d).is_dir():
                continue
            if names is None:
                shutil.rmtree(ROOT / d)
            else:
                for name in set(os.listdir(ROOT / d)) - names:
                    path = ROOT / d / name
                    if path.is_dir():
                        shutil.rmtree(path)
                    else:
                        path.unlink()
    print("check_readme_commands: seconds per page: " +
          ", ".join(f"{page} {sec:.0f}" for page, sec in page_seconds.items()))
    if failed:
        print(f"check_readme_commands: {len(failed)} command(s) failed:\n  " + "\n  ".join(failed))
        return 1
    print(f"check_readme_commands: every command ran ({len(commands)} listed, "
          f"{sum(1 for c in commands if c[2])} of them not run)")
    return check_links()


if __name__ == "__main__":
    sys.exit(main())
