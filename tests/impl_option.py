"""The --impl option, a plugin that pytest.ini loads (-p) before pytest reads its command line.

Defined in tests/conftest.py, `pytest --impl solutions` (with a space) failed: pytest took
`solutions` for the folder to test before it had read the conftest that says --impl takes a value."""


def pytest_addoption(parser):
    parser.addoption(
        "--impl",
        choices=["solutions", "template"],
        default="solutions",
        help="check solutions/ (the default: instructors and CI) or the template_*.py files "
        "at the top of the repository (students)",
    )
