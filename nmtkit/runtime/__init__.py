"""The process and the machine it runs on, set up once: the device and autocast dtype
(``device``), CPU threads (``threads``), torch.compile where it can run (``compiler``),
glibc malloc tuning (``allocator``), and the stderr console every message and bar goes
through (``console``)."""
