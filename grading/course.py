"""The course's own files: what a test or grading copy of this repository is made of.

    copy_course("/tmp/x/repo")       # the files git tracks, the templates untouched

Copying the whole folder would also copy whatever lives in a clone without being part of
the course: a virtual environment (.venv, several GB: six prepared submissions once
filled a disk), CIFAR-10, runs/, grades/. And a student's filled-in template_*.py files
are not the course's: a copy gets the committed, untouched ones.
"""
import os
import shutil
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Outside a git checkout (an unpacked archive) everything is copied except these, and any
# folder that holds a virtual environment (a pyvenv.cfg file), whatever its name.
NOT_THE_COURSE = shutil.ignore_patterns(".git", "__pycache__", ".pytest_cache", "*.pyc", "*.egg-info", ".venv",
                                        "venv", "data", "runs", "grades")


def _git(repo, *args):
    """git's output in `repo` as bytes, or None if git or the checkout is missing."""
    try:
        return subprocess.run(["git", "-C", repo, *args], capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def tracked_files(repo=REPO):
    """The paths git tracks in `repo`, relative and '/'-separated, or None outside a git checkout."""
    out = _git(repo, "ls-files", "-z")
    return None if out is None else [path for path in out.decode().split("\0") if path]


def is_template(path):
    return "/" not in path and path.startswith("template_") and path.endswith(".py")


def untouched(path, repo=REPO):
    """The committed text of `path` (a template as the course hands it out, even in a clone whose own
    template is filled in; copy_course takes the same), or the working tree's outside a git checkout."""
    committed = _git(repo, "show", f"HEAD:{path}")
    if committed is None:
        with open(os.path.join(repo, *path.split("/")), "rb") as f:
            committed = f.read()
    return committed.decode()


def copy_course(dest, repo=REPO, exclude=()):
    """Copy the course's files from `repo` to the new folder `dest`.

    In a git checkout: the files git tracks, as they are in the working tree (so uncommitted
    changes to the tests count), except the top-level template_*.py files, which are taken
    from the last commit. `exclude`: real paths of folders never to copy (submissions kept
    inside the repository)."""
    exclude = {os.path.realpath(path) for path in exclude}
    paths = tracked_files(repo)
    if paths is None:
        def ignore(folder, entries):
            skipped = set(NOT_THE_COURSE(folder, entries))
            return skipped | {e for e in entries if os.path.realpath(os.path.join(folder, e)) in exclude
                              or os.path.isfile(os.path.join(folder, e, "pyvenv.cfg"))}
        shutil.copytree(repo, dest, ignore=ignore)
        return dest
    os.makedirs(dest)
    for path in paths:
        source = os.path.join(repo, *path.split("/"))
        real = os.path.realpath(source)
        if any(real == folder or real.startswith(folder + os.sep) for folder in exclude):
            continue
        target = os.path.join(dest, *path.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        committed = _git(repo, "show", f"HEAD:{path}") if is_template(path) else None
        if committed is not None:
            with open(target, "wb") as f:
                f.write(committed)
        elif os.path.lexists(source):  # a tracked file deleted in the working tree is left out
            shutil.copy2(source, target, follow_symlinks=False)
    return dest
