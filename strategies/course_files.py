"""Which files a run trains with: --impl template (the student's template_*.py), solutions (the
reference answers) or ddp (PyTorch's own, with the course's code it shares, such as the loaders),
and what to say when one of their tasks is still a TODO."""
import importlib
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def course_module(impl, name):
    """template_<name>.py of --impl: yours (template) or solutions/' (solutions, and ddp for the
    code the baseline shares with ours, such as the evaluation loaders: yours in a student
    release, which has no solutions/)."""
    return importlib.import_module(("" if uses_your_files(impl) else "solutions.") + name)


def uses_your_files(impl):
    return impl == "template" or (impl == "ddp" and not has_solutions())


def has_solutions():
    """False in a student release (tools/student_release.py), which leaves solutions/ out."""
    return os.path.isdir(os.path.join(REPO, "solutions"))


def unfilled_task(impl, files, root=None):
    """The first 'Task X.Y' whose TODO still raises NotImplementedError, or None. `files`:
    file names, or (file name, function) where training uses only that function of the file."""
    if not uses_your_files(impl):
        return None
    root = root or REPO
    for name in files:
        name, function = name if isinstance(name, tuple) else (name, None)
        with open(os.path.join(root, name)) as f:
            text = f.read()
        if function:  # from its def (or class) to the next top-level def or class
            start = re.search(rf"\n(def {function}\(|class {function}\b)", text).start()
            text = re.split(r"\n(?=def |class )", text[start + 1:])[0]
        found = re.search(r'raise NotImplementedError\("(Task \d+\.\d+)', text)
        if found:
            return found.group(1), name
    return None


def not_done(impl, files):
    """What to say when a task these files train with is not done yet (its TODO still raises), or None."""
    task = unfilled_task(impl, files)
    if task is None:
        return None
    return (f"{task[0]} in {task[1]} is not done yet, so training with --impl {impl} cannot start.\n"
            f"Fill it in and check it with:  python check.py {task[0][5:]}"
            + ("\nor train with the reference answers:  --impl solutions" if has_solutions() else ""))
