"""`cmake --install` of the build folder into a fresh prefix P puts the program in P/bin and the
documentation (README.md, docs/*.md) in P/share/doc/fsdp, and the installed program runs
(P/bin/fsdp --help) from there."""
import glob
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t

build = os.path.dirname(os.path.abspath(t.BIN))
prefix = t.tmpdir("install-prefix")
r = subprocess.run(["cmake", "--install", build, "--prefix", prefix], capture_output=True, text=True, timeout=300)
t.check(r.returncode == 0, "cmake --install %s --prefix %s exits 0%s" % (build, prefix, "" if r.returncode == 0 else
                                                                         ":\n" + r.stdout + r.stderr))

program = os.path.join(prefix, "bin", "fsdp")
t.check(os.access(program, os.X_OK), "the program is installed as P/bin/fsdp")
docs = os.path.join(prefix, "share", "doc", "fsdp")
expected = ["README.md"] + [os.path.relpath(p, os.path.join(t.ROOT, "docs")) for p in glob.glob(os.path.join(t.ROOT, "docs", "*.md"))]
if os.path.exists(os.path.join(t.ROOT, "LICENSE")):
    expected.append("LICENSE")
for name in expected:
    t.check(os.path.isfile(os.path.join(docs, name)), "P/share/doc/fsdp/%s is installed" % name)

if os.access(program, os.X_OK):
    r = subprocess.run([program, "--help"], env=t.ENV, capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    t.check(r.returncode == 0 and "usage: fsdp COMMAND" in out,
            "the installed P/bin/fsdp --help exits 0 and prints the usage (exit %d)%s" %
            (r.returncode, "" if r.returncode == 0 else ":\n" + out))
t.finish()
