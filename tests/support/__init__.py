"""Helpers that several test files share, fixtures among them where only some files need them
(conftest.py holds those every file may use and the common builders of tiny data, recipes and
models); a test file never imports another test file. ``cli``: nmtkit run in this process
or as a subprocess, and the one-line error checks; ``damage``: files damaged as disks, copies
and people do; ``search_models``: a small random model and a scripted one for search tests, and
the scores to check them against; ``resume``: training killed and resumed through the command
line; ``planted``: a corpus with planted problems for prepare; ``recipe_space``: every recipe
key and values of any type to try on them; ``sweeps``: a tiny sweep task and ``nmtkit sweep``
run on it; ``guided``: a trained tiny model (module fixtures) and lines translated with guides;
``text_io``: files of lines and consoles that print into a string; ``marian_models``: tiny
MarianMT models written as Hugging Face directories, the stand-in for a downloaded OPUS-MT model."""
