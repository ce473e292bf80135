"""How nmtkit keeps what it writes whole: atomic writes and directory locks (``files``),
what ``-o`` may name (``outputs``), the finished chunks of an output not yet whole
(``partial``), and the checksum manifest every reader verifies (``checksums``)."""
