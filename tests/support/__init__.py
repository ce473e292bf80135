"""Helpers that several test files share; fixtures and the tiny model and data builders are in
conftest.py. ``cli``: nmtkit run in this process or as a subprocess, and the one-line error
checks; ``damage``: files damaged as disks, copies and people do; ``search_models``: a small
random model for search tests and the scores to check them against; ``resume``: training
killed and resumed through the command line; ``planted``: a corpus with planted problems for
prepare; ``recipe_space``: every recipe key and values of any type to try on them."""
