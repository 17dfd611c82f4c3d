"""When one of three CPU ranks fails (a fatal error, SIGKILL, or a stall), the others stop within
seconds with a non-zero exit and a message, instead of hanging until the job's time limit."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t
import rank_failure

rank_failure.run_all(3, "cpu")
t.finish()
