"""One run owns its checkpoint directory: a second run on it is refused at once naming the holder's
host and pid; a crashed holder does not block the next run; a fresh run into a directory with
checkpoints is refused unless --resume or --overwrite; --resume auto without 'latest' takes the
newest step file that verifies, or refuses, never starting over on top of them; temporaries of dead
runs are removed; an unusable --ckpt-dir is refused before step 1."""
import os
import re
import shutil
import socket
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import ckpttest as c
import fsdptest as t


def listing(ck):
    return {n: os.stat(os.path.join(ck, n)).st_mtime_ns for n in os.listdir(ck)}


# Two runs, one directory.
D = t.tmpdir("ckpt-dir-two")
ck = os.path.join(D, "ck")
holder = c.Job(2, c.train(D, 1000000, ["--ckpt-every", "3"]))
t.check(holder.wait_for(r"checkpoint: step 3 written"), "the first run writes checkpoints")
pids = holder.rank_pids()
before = listing(ck)
rc, out, err = t.run(1, c.train(D, 1000000, ["--resume", "auto"], metrics="m2.jsonl"), timeout=60, check=False)
m = re.search(r"in use by another run \(host (\S+), pid (\d+)\)", err)
t.check(rc != 0 and m and m.group(1) == socket.gethostname() and int(m.group(2)) in pids,
        "a second run on it is refused, naming the holder's host and pid %s (%s)" % (pids, err.strip()[-300:]))
c.one_error(err, [ck, "in use by another run"], "the second run")
t.check("step 1/" not in out and not os.path.exists(os.path.join(D, "m2.jsonl")), "the second run trained nothing")
holder.kill()  # SIGKILL: the lock file stays behind, unlocked
t.check(os.path.exists(os.path.join(ck, ".lock")), "a killed holder leaves its lock file")
rc, out, err = t.run(2, c.train(D, 9, ["--resume", "auto"], metrics="m3.jsonl"), check=False)
t.check(rc == 0 and "resumed from" in out and not os.path.exists(os.path.join(ck, ".lock")),
        "a killed holder does not block the next run; the lock goes with the run that took it")

# A fresh run into a directory with checkpoints: refused, nothing touched; --overwrite replaces them.
before = listing(ck)
rc, out, err = t.run(1, c.train(D, 4), check=False)
t.check(rc != 0 and "step 1/" not in out and listing(ck) == before, "a fresh run into a used directory is refused")
c.one_error(err, [ck, "already holds checkpoints", "--resume auto", "--overwrite"], "the fresh run")
rc, out, err = t.run(2, c.train(D, 4, ["--overwrite"]), check=False)
t.check(rc == 0 and c.step_files(ck) == ["step-00000004.h5"] and c.latest(ck) == "step-00000004.h5",
        "--overwrite replaces the earlier run's checkpoints (%s)" % os.listdir(ck))

# --resume auto without 'latest'.
D = t.tmpdir("ckpt-dir-nolatest")
ck = os.path.join(D, "ck")
t.run(2, c.train(D, 4, ["--ckpt-every", "2"]))
os.unlink(os.path.join(ck, "latest"))
c.flip_byte(os.path.join(ck, "step-00000004.h5"), "model.norm.weight", 3)
rc, out, err = t.run(2, c.train(D, 6, ["--resume", "auto"]), check=False)
t.check(rc == 0 and "skipping %s/step-00000004.h5" % ck in err and
        "resumed from its newest step file that verifies, step-00000002.h5" in err and
        "resumed from %s/step-00000002.h5 at step 2" % ck in out and c.latest(ck) == "step-00000006.h5",
        "without 'latest' it resumes from the newest step file that verifies (%s)" % err.strip()[-400:])
os.unlink(os.path.join(ck, "latest"))
for n in c.step_files(ck):
    c.flip_byte(os.path.join(ck, n), "model.norm.weight", 1)
before = listing(ck)
rc, out, err = t.run(2, c.train(D, 8, ["--resume", "auto"], metrics="m2.jsonl"), check=False)
t.check(rc != 0 and "step 1/" not in out and "step 7/" not in out and listing(ck) == before,
        "when none verifies it refuses, never starting over on top of them")
c.one_error(err, [ck, "none of its 3 step files verifies"], "no step file verifies")

# Temporaries of a dead run are removed at the start of the next.
D = t.tmpdir("ckpt-dir-stale")
ck = os.path.join(D, "ck")
t.run(1, c.train(D, 2))
for n in ("step-00000099.h5.tmp", "latest.tmp"):
    open(os.path.join(ck, n), "w").write("left by a killed run")
open(os.path.join(ck, "notes.tmp"), "w").write("not ours")
rc, out, err = t.run(1, c.train(D, 3, ["--resume", "auto"]), check=False)
t.check(rc == 0 and "removed %s/step-00000099.h5.tmp" % ck in out and c.temporaries(ck) == ["notes.tmp"],
        "stale temporaries removed and reported, other files kept (%s)" % os.listdir(ck))

# Unusable directories are refused before step 1.
D = t.tmpdir("ckpt-dir-bad")
plain = os.path.join(D, "file")
open(plain, "w").write("x")
for ckpt_dir, needle in ((plain, "is a regular file, not a directory"),
                         (os.path.join(plain, "sub"), "cannot be created")):
    rc, out, err = t.run(2, ["train"] + c.TINY + ["--steps", "2", "--ckpt-dir", ckpt_dir], check=False)
    t.check(rc != 0 and "step 1/" not in out, "--ckpt-dir %s refused before step 1" % needle)
    c.one_error(err, [ckpt_dir, needle], "--ckpt-dir that " + needle)
ro = os.path.join(D, "readonly")
os.makedirs(ro)
os.chmod(ro, 0o555)
if os.access(ro, os.W_OK):  # root writes anywhere: make it immutable instead, where that is allowed
    os.system("chattr +i %s 2>/dev/null" % ro)
if not os.access(ro, os.W_OK) or os.system("touch %s/probe 2>/dev/null" % ro) != 0:
    rc, out, err = t.run(2, ["train"] + c.TINY + ["--steps", "2", "--ckpt-dir", ro], check=False)
    t.check(rc != 0 and "step 1/" not in out, "a read-only --ckpt-dir is refused before step 1")
    c.one_error(err, [ro, "is not writable"], "a read-only --ckpt-dir")
else:
    print("note: cannot make a read-only directory here (root without chattr): that check is skipped")
os.system("chattr -i %s 2>/dev/null" % ro)
os.chmod(ro, 0o755)
shutil.rmtree(ro, ignore_errors=True)
t.finish()
