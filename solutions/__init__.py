"""Reference answers: the template_*.py files with every TODO filled in, and nothing else changed."""
