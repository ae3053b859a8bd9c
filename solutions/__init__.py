"""Reference answers to the graded exercises: the single source that exercises/ is generated from."""
