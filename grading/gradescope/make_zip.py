"""Build the zip to upload to Gradescope as a programming assignment's autograder.

    python grading/gradescope/make_zip.py autograder.zip

The zip holds setup.sh and run_autograder at its top (where Gradescope looks for them) and
the course in course/: the files git tracks, the templates untouched, solutions/ included
(each task's tests use the reference answers to the other tasks, as on your machine).
Students upload their template_*.py files, or their whole repository; Gradescope runs
run_autograder, which runs grading/grade.py --format gradescope on the submission.
"""
import argparse
import os
import shutil
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)
from grading.course import copy_course  # noqa: E402


def build(path, repo=REPO):
    """Write the zip to `path`; returns the names it holds."""
    with tempfile.TemporaryDirectory(prefix="gradescope-") as work:
        course = copy_course(os.path.join(work, "course"), repo)
        names = []
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
            for name in ("setup.sh", "run_autograder"):
                info = zipfile.ZipInfo(name)
                info.external_attr = 0o100755 << 16  # executable, as Gradescope runs them
                with open(os.path.join(HERE, name), "rb") as f:
                    archive.writestr(info, f.read(), zipfile.ZIP_DEFLATED)
                names.append(name)
            for here, dirs, files in os.walk(course):
                dirs.sort()
                for name in sorted(files):
                    full = os.path.join(here, name)
                    arcname = os.path.relpath(full, work).replace(os.sep, "/")
                    archive.write(full, arcname)
                    names.append(arcname)
    return names


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("zip", help="the zip to write, like autograder.zip")
    args = parser.parse_args(argv)
    names = build(args.zip)
    size = os.path.getsize(args.zip) / 2 ** 20
    print(f"Wrote {args.zip} ({len(names)} files, {size:.1f} MB): upload it as the autograder of a Gradescope "
          f"programming assignment.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
