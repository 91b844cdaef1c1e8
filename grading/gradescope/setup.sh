#!/usr/bin/env bash
# Gradescope runs this once, when it builds the autograder's image (Ubuntu): Python, the
# course's requirements (PyTorch for CPUs) and bubblewrap, the sandbox grade.py uses where the
# image allows it. The course itself is in /autograder/source/course (make_zip.py put it there).
set -euo pipefail
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-pip python3-venv bubblewrap util-linux git
python3 -m pip install --quiet --upgrade pip
python3 -m pip install --quiet torch torchvision --index-url https://download.pytorch.org/whl/cpu
python3 -m pip install --quiet -r /autograder/source/course/requirements.txt "tomli; python_version < '3.11'"
