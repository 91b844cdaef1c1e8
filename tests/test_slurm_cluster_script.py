"""tools/slurm_test_cluster.sh without SLURM: stand-ins for its daemons check how it starts.

    pytest tests/test_slurm_cluster_script.py

It once waited about ten minutes, silently, when its daemons had died (sinfo asked a controller
that was not there, 60 times), and it used SLURM's default ports although it says that a real
SLURM on the machine is left alone.
"""
import os
import signal
import stat
import subprocess
import time

import pytest

pytestmark = pytest.mark.repo

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STUBS = {
    "id": "echo 0",
    "munge": "cat >/dev/null; echo credential",
    "unmunge": "cat >/dev/null",
    "munged": "exit 0",
    "sbatch": "exit 0",
    "sinfo": "exit 1",  # no controller answers
    # the controller starts and stays up
    "slurmctld": 'sleep 120 >/dev/null 2>&1 & echo $! > "$SLURM_TEST_DIR/slurmctld.pid"',
    # a slurmd starts, detaches, and dies at once (its port taken, say): its pid file names a dead process
    "slurmd": 'if [ "$1" = -C ]; then echo "NodeName=x CPUs=2 RealMemory=4000"; exit 0; fi\n'
              'echo "error: Error binding slurm stream socket: Address already in use" > "$SLURM_TEST_DIR/slurmd-$2.log"\n'
              'sh -c \'echo $$\' > "$SLURM_TEST_DIR/slurmd-$2.pid"',
}


def test_start_uses_its_own_ports_and_fails_at_once_when_a_daemon_dies(tmp_path):
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, body in STUBS.items():
        path = stubs / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    cluster = tmp_path / "cluster"
    env = {**os.environ, "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}", "SLURM_TEST_DIR": str(cluster),
           "SLURM_TEST_PORT": "26817"}
    start = time.monotonic()
    try:
        done = subprocess.run(["bash", "tools/slurm_test_cluster.sh", "start"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=60)
    finally:
        pidfile = cluster / "slurmctld.pid"
        if pidfile.exists():  # the stand-in controller this test started
            try:
                os.kill(int(pidfile.read_text()), signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                pass
    seconds = time.monotonic() - start
    assert done.returncode != 0, done.stdout + done.stderr
    assert seconds < 10, f"a dead slurmd was noticed only after {seconds:.0f} s:\n{done.stderr}"
    assert "the slurmd of node" in done.stderr and "Address already in use" in done.stderr, done.stderr
    conf = (cluster / "slurm.conf").read_text()
    assert "SlurmctldPort=26817" in conf and "Port=26818" in conf and "Port=26819" in conf, conf
    assert "6817\n" not in conf.replace("26817\n", "") and "Port=6818 " not in conf, conf
