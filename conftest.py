"""pytest's --impl option, here at the top of the repository rather than in tests/conftest.py:
pytest reads this file before it parses the command line, so `pytest --impl solutions` (with a
space) works; from tests/ alone it took `solutions` for a folder to test ("unrecognized arguments").
"""


def pytest_addoption(parser):
    parser.addoption(
        "--impl",
        choices=["solutions", "template"],
        default="solutions",
        help="check solutions/ (the default: instructors and CI) or the template_*.py files "
        "at the top of the repository (students)",
    )
