"""A real one-node SLURM cluster for tests, from Debian's packages (slurmctld, slurmd, munge).

Everything the cluster owns lives in one private directory: its slurm.conf, munge key and socket,
spool, state and TmpFS directories, pid and log files, and two free TCP ports; its job ids start at
a random multiple of 100000. Nothing under /etc, /run or
/var is touched, so two tests can each run a cluster on the same machine at the same time. Client
commands reach the cluster through SLURM_CONF (in `cluster.env`, which every job inherits), and that
marker is how stop() finds every process the cluster started, jobs included, and ends it.

    from slurm_cluster import SlurmCluster, SlurmUnavailable
    try:
        cluster = SlurmCluster(gpus=4).start()
    except SlurmUnavailable as e:        # not root: SLURM cannot run here (skip the test)
        print("SKIPPED:", e); sys.exit(77)
    try:
        job = cluster.sbatch("jobs/ladder.slurm", ["--ntasks-per-node", "2"], env={"DEVICE": "cpu"}, cwd=work)
        state = cluster.wait(job, timeout=300)          # "COMPLETED", "FAILED", ...
        cluster.signal(job, "USR1", batch=True)         # scancel --signal=USR1 [--batch]
        cluster.requeue(job); cluster.scancel(job)      # (a requeued job waits requeue_delay s)
    finally:
        cluster.stop()                                  # every daemon and job process it started

Needs root (slurmd starts jobs as their users) and the packages tools/bootstrap.sh --tests installs.
FSDP_KEEP_SLURM=1 keeps the cluster's directory (config, daemon logs) after stop() for debugging.
"""
import os
import random
import shutil
import signal as signals
import socket
import subprocess
import tempfile
import time

FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                "BOOT_FAIL", "DEADLINE"}
DAEMONS = ("munged", "slurmctld", "slurmd")


class SlurmUnavailable(Exception):
    """SLURM cannot run in this environment at all (the caller skips its test)."""


class SlurmError(Exception):
    """The cluster or a command failed; the message carries the daemons' log tails."""


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _memory_mb():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return 2


def _which(name):
    for d in ("/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        p = os.path.join(d, name)
        if os.access(p, os.X_OK):
            return p
    return shutil.which(name)


class SlurmCluster:
    def __init__(self, cpus=None, gpus=0, memory_mb=None, extra_conf="", workdir=None, requeue_delay=None):
        """cpus: CPUs the node offers (default: this machine's); gpus: stand-in `gpu` GRES the node
        offers, so job scripts asking for `--gres gpu:N` run unchanged (no real device is bound);
        memory_mb: the node's memory (default: half of this machine's; more than it has would
        leave the node unusable); extra_conf: lines appended to slurm.conf (JobRequeue=1, say);
        requeue_delay: seconds a requeued job waits before it may start again (SLURM's default is
        120; it is the credential lifetime, AuthInfo's cred_expire, which slurm.conf(5) says
        controls this wait too)."""
        self.cpus = cpus or os.cpu_count() or 1
        self.gpus = gpus
        self.memory_mb = memory_mb or max(1, _memory_mb() // 2)
        self.extra_conf = extra_conf
        self.requeue_delay = requeue_delay
        self.dir = workdir
        self.procs = {}
        self.env = None
        self.controller_started = None
        self.host = socket.gethostname().split(".")[0]

    # ---- life cycle ----

    def start(self, timeout=60):
        if os.geteuid() != 0:
            raise SlurmUnavailable("SLURM needs root to start slurmd and run jobs (running as uid %d)" % os.geteuid())
        missing = [d for d in DAEMONS + ("sbatch", "scontrol", "squeue", "scancel") if not _which(d)]
        if missing:
            raise SlurmError("not installed: %s (tools/bootstrap.sh --tests installs them)" % ", ".join(missing))
        # A short path: munge's socket name must fit in a UNIX socket address.
        self.dir = self.dir or tempfile.mkdtemp(prefix="fsdp-slurm-", dir="/tmp")
        os.chmod(self.dir, 0o755)
        for sub in ("spool", "state", "munge", "tmp"):
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        os.chmod(os.path.join(self.dir, "munge"), 0o700)
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.munge_socket = os.path.join(self.dir, "munge", "munge.socket")
        key = os.path.join(self.dir, "munge", "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        self._write_conf()
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        try:
            self._spawn("munged", [_which("munged"), "--foreground", "--force", "--socket=" + self.munge_socket,
                                   "--key-file=" + key, "--pid-file=" + os.path.join(self.dir, "munged.pid"),
                                   "--log-file=" + os.path.join(self.dir, "munged.log"),
                                   "--seed-file=" + os.path.join(self.dir, "munge", "munged.seed")])
            self._wait_for(lambda: os.path.exists(self.munge_socket), 15, "munged's socket")
            self._spawn("slurmctld", [_which("slurmctld"), "-D", "-f", self.conf])
            # slurmctld looks at time limits, and sends the signals of --signal=...@T, every 30 s
            # from its start (PERIODIC_TIMEOUT): a test can time a job against it.
            self.controller_started = time.time()
            self._spawn("slurmd", [_which("slurmd"), "-D", "-f", self.conf, "-N", self.host])
            self._wait_for(self._node_ready, timeout, "the node to register as idle")
        except Exception:
            self.stop()
            raise
        return self

    def stop(self):
        """Cancels every job, stops the daemons it started, then ends any process still carrying this
        cluster's SLURM_CONF (job steps, slurmstepd), and removes the cluster's directory."""
        if self.env and self.procs.get("slurmctld") and self.procs["slurmctld"].poll() is None:
            subprocess.run([_which("scancel"), "--full", "--user", "root"], env=self.env, capture_output=True,
                           timeout=30)
            try:
                self._wait_for(lambda: not self._squeue_ids(), 20, "jobs to end")
            except SlurmError:
                pass
        for name in ("slurmd", "slurmctld", "munged"):
            p = self.procs.pop(name, None)
            if p and p.poll() is None:
                p.terminate()
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
        if self.dir:
            for pid in self.processes():
                try:
                    os.kill(pid, signals.SIGKILL)
                except ProcessLookupError:
                    pass
        if self.dir and not os.environ.get("FSDP_KEEP_SLURM"):
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # ---- jobs ----

    def sbatch(self, script, args=(), env=None, cwd=None, script_args=()):
        """Submits `script` with sbatch options `args` and the script's own arguments `script_args`; env
        adds to the submitting environment (which the job inherits). Returns the job id (str)."""
        run_env = dict(self.env, **(env or {}))
        p = subprocess.run([_which("sbatch"), "--parsable"] + list(args) + [script] + list(script_args), env=run_env,
                           cwd=cwd,
                           capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise SlurmError("sbatch %s failed (exit %d): %s" % (script, p.returncode, p.stderr.strip()))
        return p.stdout.strip().split(";")[0]

    def job(self, job_id):
        """scontrol's fields of a job as a dict (JobState, ExitCode, Restarts, ...); {} once forgotten."""
        p = subprocess.run([_which("scontrol"), "show", "job", "--oneliner", str(job_id)], env=self.env,
                           capture_output=True, text=True, timeout=30)
        fields = {}
        for token in p.stdout.split():
            if "=" in token:
                k, v = token.split("=", 1)
                fields.setdefault(k, v)
        return fields

    def state(self, job_id):
        return self.job(job_id).get("JobState", "UNKNOWN")

    def wait(self, job_ids, timeout=300, states=FINAL_STATES):
        """Waits until every job is in one of `states`; returns {job: state} (str: one job's state)."""
        single = isinstance(job_ids, (str, int))
        ids = [str(job_ids)] if single else [str(j) for j in job_ids]
        deadline = time.time() + timeout
        while True:
            now = {j: self.state(j) for j in ids}
            if all(s in states for s in now.values()):
                return now[ids[0]] if single else now
            if time.time() > deadline:
                raise SlurmError("timed out after %ds waiting for jobs %s (states %s)\n%s" %
                                 (timeout, ", ".join(ids), now, self.logs()))
            time.sleep(1)

    def scancel(self, job_id, signal=None, batch=False, full=False):
        """Cancels a job, or with `signal` (a name: "USR1") only signals it: the batch shell with
        batch=True, every step with full=True."""
        cmd = [_which("scancel")]
        if signal:
            cmd.append("--signal=" + signal)
        if batch:
            cmd.append("--batch")
        if full:
            cmd.append("--full")
        p = subprocess.run(cmd + [str(job_id)], env=self.env, capture_output=True, text=True, timeout=30)
        if p.returncode != 0:
            raise SlurmError("%s %s failed (exit %d): %s" % (" ".join(cmd), job_id, p.returncode, p.stderr.strip()))

    def signal(self, job_id, signal, batch=False, full=False):
        self.scancel(job_id, signal=signal, batch=batch, full=full)

    def requeue(self, job_id, hold=False):
        """scontrol requeue (the job must be requeueable: JobRequeue=1 in extra_conf or --requeue)."""
        p = subprocess.run([_which("scontrol"), "requeuehold" if hold else "requeue", str(job_id)], env=self.env,
                           capture_output=True, text=True, timeout=30)
        if p.returncode != 0:
            raise SlurmError("scontrol requeue %s failed: %s" % (job_id, p.stderr.strip()))

    def update(self, job_id, **fields):
        """scontrol update JobId=... Field=value ... (e.g. TimeLimit=10, in minutes)."""
        args = ["%s=%s" % (k, v) for k, v in fields.items()]
        p = subprocess.run([_which("scontrol"), "update", "JobId=%s" % job_id] + args, env=self.env,
                           capture_output=True, text=True, timeout=30)
        if p.returncode != 0:
            raise SlurmError("scontrol update %s %s failed: %s" % (job_id, " ".join(args), p.stderr.strip()))

    def logs(self, lines=30):
        """The tail of every daemon log, for failure messages."""
        out = []
        for name in DAEMONS:
            path = os.path.join(self.dir or "", name + ".log")
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    tail = f.readlines()[-lines:]
                out.append("---- %s ----\n%s" % (path, "".join(tail)))
        return "\n".join(out)

    # ---- internals ----

    def _write_conf(self):
        d = self.dir
        gres = " Gres=gpu:%d" % self.gpus if self.gpus else ""
        conf = [
            "ClusterName=fsdptest",
            "SlurmctldHost=%s(127.0.0.1)" % self.host,
            "SlurmctldPort=%d" % _free_port(),
            "SlurmdPort=%d" % _free_port(),
            "AuthType=auth/munge",
            "CredType=cred/munge",
            "AuthInfo=socket=%s%s" % (self.munge_socket, ",cred_expire=%d" % self.requeue_delay
                                      if self.requeue_delay else ""),
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "SlurmUser=root",
            "SlurmdUser=root",
            "MpiDefault=pmix",
            "MinJobAge=600",
            "SlurmctldPidFile=%s/slurmctld.pid" % d,
            "SlurmdPidFile=%s/slurmd.pid" % d,
            "SlurmctldLogFile=%s/slurmctld.log" % d,
            "SlurmdLogFile=%s/slurmd.log" % d,
            "SlurmdSpoolDir=%s/spool" % d,
            "StateSaveLocation=%s/state" % d,
            # Job steps keep files named by job id in TmpFS (the pmix plugin's spmix_appdir_UID_JOB.STEP):
            # a private TmpFS, and job ids of their own, keep two clusters of one machine apart.
            "TmpFS=%s/tmp" % d,
            "FirstJobId=%d" % (random.randrange(1, 600) * 100000),
            "PlugStackConfig=%s/plugstack.conf" % d,
            "GresTypes=gpu" if self.gpus else "",
            "NodeName=%s NodeAddr=127.0.0.1 CPUs=%d RealMemory=%d%s State=UNKNOWN" %
            (self.host, self.cpus, self.memory_mb, gres),
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4",
            self.extra_conf,
        ]
        with open(self.conf, "w") as f:
            f.write("\n".join(line for line in conf if line) + "\n")
        # Stand-in GPUs: slurmd counts a gpu GRES only through device files, so each is a link to
        # /dev/null (a character device); the scheduler counts them and jobs get no device.
        with open(os.path.join(d, "gres.conf"), "w") as f:
            if self.gpus:
                os.makedirs(os.path.join(d, "dev"), exist_ok=True)
                for i in range(self.gpus):
                    os.symlink("/dev/null", os.path.join(d, "dev", "gpu%d" % i))
                f.write("NodeName=%s Name=gpu File=%s/dev/gpu[0-%d]\n" % (self.host, d, self.gpus - 1))
        open(os.path.join(d, "plugstack.conf"), "w").close()

    def _spawn(self, name, cmd):
        log = open(os.path.join(self.dir, name + ".out"), "w")
        self.procs[name] = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

    def _node_ready(self):
        for name, p in self.procs.items():
            if p.poll() is not None:
                with open(os.path.join(self.dir, name + ".out"), errors="replace") as f:
                    out = f.read()[-2000:]
                raise SlurmError("%s exited with %d: %s\n%s" % (name, p.returncode, out, self.logs()))
        p = subprocess.run([_which("sinfo"), "--noheader", "--format=%T"], env=self.env, capture_output=True,
                           text=True, timeout=30)
        return p.returncode == 0 and p.stdout.strip().rstrip("*") == "idle"

    def _squeue_ids(self):
        p = subprocess.run([_which("squeue"), "--noheader", "--format=%i"], env=self.env, capture_output=True,
                           text=True, timeout=30)
        return p.stdout.split() if p.returncode == 0 else []

    def processes(self):
        """PIDs of the processes whose environment holds this cluster's SLURM_CONF: its daemons, job
        steps and their slurmstepd (which outlive slurmd). Empty after stop()."""
        marker = ("SLURM_CONF=" + self.conf).encode() + b"\0"
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open("/proc/%s/environ" % entry, "rb") as f:
                    if marker in f.read() + b"\0":
                        pids.append(int(entry))
            except OSError:
                continue
        return pids

    def _wait_for(self, predicate, timeout, what):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if predicate():
                return
            time.sleep(0.5)
        raise SlurmError("timed out after %ds waiting for %s\n%s" % (timeout, what, self.logs()))
