"""What check.py (students) and grade.py (instructors) share: finding the tasks, running the
tests once, and turning their outcomes into a status and an explanation per task."""
