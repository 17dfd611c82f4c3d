"""What the SLURM job tests (tests/scripts/slurm_*.py) share: the one-node cluster, started or the
test skipped, and the environment a user sets to run the job scripts on CPUs."""
import sys
import time

import fsdptest as t
from slurm_cluster import SlurmCluster, SlurmError, SlurmUnavailable


def cpu_job_env(results, **more):
    """The job scripts' environment on CPUs, as root under Open MPI, their results under `results`,
    plus `more`; everything else is the scripts' defaults."""
    env = {"DEVICE": "cpu", "FSDP_BIN": t.BIN, "RESULTS_DIR": results, "OMP_NUM_THREADS": "1",
           "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    env.update(more)
    return env


def start_cluster(started, **kwargs):
    """A started SlurmCluster(**kwargs). Exits 77 (skipped) where SLURM cannot run; fails the test
    where the cluster does not start. `started`: the test's start time, for the line that says so."""
    try:
        cluster = SlurmCluster(**kwargs).start()
    except SlurmUnavailable as e:
        print("SKIPPED: %s" % e)
        sys.exit(77)
    except SlurmError as e:
        t.fail("the one-node SLURM cluster did not start: %s" % e)
        t.finish()
    print("ok: a one-node SLURM cluster is up in %.1f s (%s)" % (time.time() - started, cluster.dir), flush=True)
    return cluster
