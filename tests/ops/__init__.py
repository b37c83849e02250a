"""Per-op tests of trtcore.ops (issue 7, point 6): one file per group of ops."""
