"""Seed derivation shared by the planner (driver) and the executors (workers).

Every episode's seed derives from the step's seed, its tree id, the node it starts from and its
branch index there, and each turn's from the episode's seed and turn index: plain data any
process computes alike, so a trajectory does not depend on which executor ran it.
"""

from __future__ import annotations

import hashlib


def derive_seed(*parts: object) -> int:
    """A 62-bit seed from any parts (run seed, step, tree id, node, branch, turn ...).

    Stable across processes and machines (a BLAKE2 digest of the parts' ``repr``), unlike
    Python's salted ``hash``.
    """
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2
