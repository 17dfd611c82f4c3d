"""One place for the environment: every FSDP_* variable the program reads is read in src/base/env.c
and nowhere else in src/, and README's table of environment variables lists exactly those."""
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t

SRC = os.path.join(t.ROOT, "src")
ENV_C = os.path.join(SRC, "base", "env.c")

read_here = set(re.findall(r'"(FSDP_[A-Z0-9_]+)"', open(ENV_C).read()))
t.check(len(read_here) >= 10, "src/base/env.c reads %d variables" % len(read_here))

elsewhere = []
for folder, _, names in os.walk(SRC):
    for name in names:
        path = os.path.join(folder, name)
        if path == ENV_C or not name.endswith((".c", ".h", ".cu", ".cuh")):
            continue
        for number, line in enumerate(open(path, encoding="utf-8"), 1):
            if re.search(r'\b(getenv|secure_getenv)\s*\(\s*"FSDP_', line):
                elsewhere.append("%s:%d" % (os.path.relpath(path, t.ROOT), number))
t.check(not elsewhere, "no FSDP_* variable is read outside src/base/env.c (%s)" % ", ".join(elsewhere))

readme = open(os.path.join(t.ROOT, "README.md"), encoding="utf-8").read()
section = re.search(r"^### Environment variables\n(.*?)^#", readme, re.S | re.M)
t.check(section is not None, "README has a section 'Environment variables'")
listed = set(re.findall(r"^\| `(FSDP_[A-Z0-9_]+)` \|", section.group(1) if section else "", re.M))
t.check(listed == read_here, "README's table lists the variables env.c reads (missing: %s; not read: %s)" %
        (sorted(read_here - listed), sorted(listed - read_here)))
t.finish()
