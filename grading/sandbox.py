"""Run a submission's tests where its code cannot reach the instructor's files, the network, or
more than its share of the machine (Linux, bubblewrap).

    ok, why = sandbox.available()                  # (False, "bwrap is not installed ...") elsewhere
    argv, env = sandbox.wrap(argv, env, copy=..., writable=[...], limits=Limits())

What the code under test sees (bwrap builds a new root for it):
- the grading copy of the course, read-only; one writable folder (the test results); a private,
  size-limited /tmp; the Python installation and the system's libraries, read-only. Nothing
  else: not the course itself, not the instructor's home, not the instructor's environment
  variables (HOME is /tmp).
- no network: its own network namespace, which has only a loopback of its own (the ranks of
  the tests meet there), so no other machine and no service of this one can be reached.
- limits (setrlimit): processes and threads (set inside, where only the sandbox's count),
  memory per process (address space), the size of one file, no core files. Run as root, the
  code runs as an unprivileged user of its own (root is exempt from the process limit).
- its own process and IPC namespaces: killing the grader's process group kills every process
  it started, a fork bomb included.

Where bwrap is missing or cannot start (no user namespaces, macOS, Windows), available() says
why in one line; grade.py then refuses and asks for --no-sandbox.
"""
import dataclasses
import functools
import glob
import itertools
import os
import re
import shutil
import subprocess
import sys
import threading

# Enough for the tests: a few ranks, each with torch's and gloo's threads (threads count).
# points.toml's [sandbox] section overrides these.
DEFAULTS = {"processes": 1024, "memory_gb": 8.0, "file_gb": 1.0, "tmp_gb": 2.0}
# When the grader is root (root ignores the process limit), each submission runs as a user of
# its own, counted from here: a fork bomb uses up its own user's limit, not its neighbour's.
ROOT_RUNS_AS = 61000
_next_user = itertools.count()
_lock = threading.Lock()

# /etc is not bound whole: only what Python, torch and a name lookup of localhost read.
ETC = ["ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf", "host.conf", "gai.conf",
       "ssl", "alternatives", "mime.types"]
SYSTEM = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/sys"]

# What a contained submission leaves in its log, and the note it becomes.
SIGNS = [
    ("Read-only file system", "it tried to write outside its folder (refused: read-only)"),
    ("Permission denied", "it was refused a file it may not change (Permission denied)"),
    ("Network is unreachable", "it tried to reach the network (refused: no network in the sandbox)"),
    ("Connection refused", "a connection was refused (the sandbox has no network but its own loopback)"),
    ("Resource temporarily unavailable", "it reached the process limit (fork: Resource temporarily unavailable)"),
    ("File too large", "it reached the file size limit (File too large)"),
    ("No space left on device", "it filled its private /tmp (No space left on device)"),
    ("Cannot allocate memory", "it reached the memory limit (Cannot allocate memory)"),
]


@dataclasses.dataclass
class Limits:
    processes: int = DEFAULTS["processes"]
    memory_gb: float = DEFAULTS["memory_gb"]  # per process; 0: none (not applied where there are GPUs)
    file_gb: float = DEFAULTS["file_gb"]
    tmp_gb: float = DEFAULTS["tmp_gb"]

    @classmethod
    def from_policy(cls, table):
        return cls(**{key: type(value)(table.get(key, value)) for key, value in DEFAULTS.items()})


def _bwrap():
    return shutil.which("bwrap")


@functools.lru_cache(maxsize=None)
def available():
    """(True, "") if a sandbox can start here, else (False, why in one line)."""
    if not sys.platform.startswith("linux"):
        return False, f"the sandbox needs Linux (this is {sys.platform})"
    if not _bwrap():
        return False, "bwrap is not installed (Debian, Ubuntu: apt-get install bubblewrap)"
    if not shutil.which("prlimit"):
        return False, "prlimit is not installed (util-linux)"
    argv, env = wrap([sys.executable, "-c", "import os; print('ok')"], {}, copy=None, writable=[],
                     limits=Limits())
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as error:
        return False, f"bwrap did not start: {error}"
    if done.returncode != 0 or done.stdout.strip() != "ok":
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return False, f"bwrap did not start ({last})"
    return True, ""


def _python_paths():
    """The folders of the Python installation in use (a venv and its base), and site-packages."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    paths |= {p for p in sys.path if p and os.path.isdir(p) and ("site-packages" in p or "dist-packages" in p
                                                                  or p.startswith(sys.base_prefix))}
    return sorted({os.path.realpath(p) for p in paths} | paths)


def _parents(path):
    """/a, /a/b for /a/b/c: bwrap would create them with the mode of the original (/root: 0700)."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def new_user():
    """A user id for one submission (used when the grader runs as root)."""
    with _lock:
        return ROOT_RUNS_AS + next(_next_user) % 1000


def wrap(argv, env, copy, writable, limits, cwd=None, user=ROOT_RUNS_AS):
    """(argv, env) that run `argv` in the sandbox. `copy`: the grading copy (read-only),
    `writable`: folders it may write (the results), `cwd`: where it starts (default: copy),
    `user`: whom it runs as if this is root (prepare() gives that user the folders)."""
    binds, made = [], set()

    def bind(kind, path, target=None):
        target = target or path
        for parent in _parents(target):
            if parent not in made:
                made.add(parent)
                binds.extend(["--perms", "0755", "--dir", parent])
        binds.extend([kind, path, target])

    for path in SYSTEM:
        if os.path.exists(path):
            binds.extend(["--ro-bind", path, path])  # symlinks (/lib -> usr/lib) are bound as what they point at
    binds.extend(["--perms", "0755", "--dir", "/etc"])  # else made 0700: no user but root could look inside
    for name in ETC:
        binds.extend(["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"])
    binds.extend(["--ro-bind-try", "/etc/hosts", "/etc/hosts"])  # the hostname is localhost inside
    done = list(SYSTEM)
    for path in _python_paths():
        if not any(path == s or path.startswith(s + "/") for s in done):
            bind("--ro-bind", path)
            done.append(path)
    for private in ("/tmp", "/dev/shm"):  # multiprocessing's locks live in /dev/shm
        binds.extend(["--perms", "1777", "--size", str(int(limits.tmp_gb * 2 ** 30)), "--tmpfs", private])
    if copy:
        bind("--ro-bind", copy)
    for path in writable:
        bind("--bind", path)
    gpus = glob.glob("/dev/nvidia*") + glob.glob("/dev/dri")
    for device in gpus:  # the GPU tests, where there are GPUs
        binds.extend(["--dev-bind", device, device])
    inside_env = {"PATH": os.pathsep.join([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"]),
                  "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8", "GLOO_SOCKET_IFNAME": "lo",
                  "MASTER_ADDR": "127.0.0.1"}
    for key in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "OMP_NUM_THREADS",
                "CUDA_VISIBLE_DEVICES", "VIRTUAL_ENV"):
        if key in env:
            inside_env[key] = env[key]
    setenv = [word for key, value in sorted(inside_env.items()) for word in ("--setenv", key, value)]
    # not root: a user namespace of its own, in which the process limit counts its processes only
    user_ns = ["--unshare-user"] if os.geteuid() != 0 else []
    command = [_bwrap() or "bwrap", *user_ns, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc",
               "--unshare-net", "--unshare-uts", "--unshare-cgroup-try", "--hostname", "localhost",
               "--proc", "/proc", "--dev", "/dev", *binds, "--clearenv", *setenv,
               "--chdir", cwd or copy or "/tmp", "--"]
    # inside, once the mounts are made: root drops to a user of its own; then the process limit
    command += [sys.executable, "-c", _LAUNCH, str(limits.processes), str(user if os.geteuid() == 0 else -1)]
    limit = ["prlimit", f"--fsize={int(limits.file_gb * 2 ** 30)}", "--core=0"]
    if limits.memory_gb and not gpus:  # CUDA reserves far more address space than it uses
        limit.append(f"--as={int(limits.memory_gb * 2 ** 30)}")
    return limit + ["--"] + command + list(argv), {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


# The process limit is set inside the sandbox's user namespace, where it counts the sandbox's
# processes only: set outside, the kernel would count every process of the instructor's user.
_LAUNCH = ("import os, resource, sys\n"
           "processes, uid = int(sys.argv[1]), int(sys.argv[2])\n"
           "if uid >= 0:\n"
           "    os.setgroups([]); os.setgid(uid); os.setuid(uid)\n"
           "resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))\n"
           "os.execvp(sys.argv[3], sys.argv[3:])\n")


def prepare(copy, writable, user=ROOT_RUNS_AS):
    """Let the unprivileged user of a root grader read the copy and write the results."""
    if os.geteuid() != 0:
        return
    for here, dirs, files in os.walk(copy):
        os.chmod(here, 0o755)
        for name in files:
            path = os.path.join(here, name)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode | 0o444)
    for parent in [os.path.dirname(copy)] + [os.path.dirname(p) for p in writable]:
        os.chmod(parent, os.stat(parent).st_mode | 0o111)
    for path in writable:
        os.chown(path, user, user)


def notes_from_log(text, copy, course=None):
    """The notes for what the sandbox refused, from a submission's pytest log. `copy`: the
    grading copy, whose own missing files are no sign of anything; the private /tmp's neither,
    except the instructor's `course` folder, which may be under /tmp too (a CI clone, say)."""
    notes = [f"sandbox: {note}" for sign, note in SIGNS if sign in text]

    def hidden_by_the_sandbox(path):
        if path.startswith(copy + "/"):
            return False
        if course and path.startswith(course.rstrip("/") + "/"):
            return True
        return not path.startswith(("/tmp/", "/dev/shm/", "/proc/"))

    hidden = sorted({path for path in re.findall(r"No such file or directory: '(/[^']+)'", text)
                     if hidden_by_the_sandbox(path)})
    if hidden:
        shown = ", ".join(hidden[:3]) + (", ..." if len(hidden) > 3 else "")
        notes.append(f"sandbox: it tried to open {shown}, outside its folder (hidden by the sandbox)")
    return notes
