"""Testing aids shipped with fedmem: the privacy mutation suite (:mod:`fedmem.testing.mutants`)."""
