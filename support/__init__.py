"""Given code that the templates and train_ddp.py import: the machinery a task needs but does not
teach (checkpoint folders, signals, file formats, argument checks, the metrics' CSV and plots, the
profiler's timeline), kept out of the template_*.py
files so that a template holds its tasks, what they call, and why. A student may read it; no
answer to a task is in it (tests/test_student_release.py checks)."""
