"""The ring bookkeeping of BatchNorm v50 / v51's two-phase kernels (experiments/bn-v50-two-
phase-forward.patch, bn-v51-two-phase-backward.patch) in Python, no GPU needed: one thread's
walk_ring over its K packs (the first HELD streams copied, the others null), then
walk_back_held over the same packs last first. Copies land group by group in commit order,
and cp.async.wait_group<RING - 2> lands all but the newest RING - 2 groups. Checked: every
pack applied finds each stream's own pack in its slot (held from the first walk or copied
since), and no copy goes into a slot whose pack is still to be applied. Mirrors the kernels'
loops; change both together.

    python benchmarks/emulate_two_phase_ring.py
"""
from __future__ import annotations


class Ring:
    """One thread's RING slots of NS streams, the copies in flight in commit order."""

    def __init__(self, ring: int, streams: int):
        self.ring, self.slots = ring, [[None] * streams for _ in range(ring)]
        self.groups: list[list] = []
        self.landed = 0

    def commit(self, copies: list) -> None:
        self.groups.append(copies)

    def wait(self, pending: int) -> None:
        while len(self.groups) - self.landed > pending:
            for slot, stream, pack in self.groups[self.landed]:
                self.slots[slot][stream] = pack
            self.landed += 1


def first_walk(r: Ring, K: int, held: int) -> None:
    """walk_ring: packs d < RING - 1 copied ahead, then pack k read and k + RING - 1 copied."""
    def issue(k):
        r.commit([(k & (r.ring - 1), s, k) for s in range(held)] if k < K else [])

    for d in range(r.ring - 1):
        issue(d)
    for k in range(K):
        r.wait(r.ring - 2)
        assert all(r.slots[k & (r.ring - 1)][s] == k for s in range(held)), ("first walk", k)
        issue(k + r.ring - 1)
    r.wait(0)


def walk_back(r: Ring, K: int, held: int, streams: int) -> None:
    """walk_back_held: packs K - 1 down to 0; a held stream is copied only below K - RING."""
    applied = set()

    def issue(k):
        copies = [] if k < 0 else [(k & (r.ring - 1), s, k) for s in range(streams) if s >= held or k < K - r.ring]
        for slot, stream, _ in copies:
            now = r.slots[slot][stream]
            assert now is None or now in applied or now == k, ("copy over a pack not yet applied", now, k)
        r.commit(copies)

    for d in range(r.ring - 1):
        issue(K - 1 - d)
    for j in range(K):
        k = K - 1 - j
        r.wait(r.ring - 2)
        assert all(r.slots[k & (r.ring - 1)][s] == k for s in range(streams)), ("walk back", K, j, k)
        applied.add(k)
        issue(k - (r.ring - 1))
    r.wait(0)


# (RING, NS, HELD): v50's forward plain (8, 1, 1) and with a residual (4, 2, 1); v51's
# backward, x and dy held (4, 2, 2); and the smallest rings CUNORM_BN_CL_RING allows
CASES = [(8, 1, 1), (4, 2, 1), (4, 2, 2), (2, 2, 2), (2, 2, 1), (2, 1, 1), (16, 1, 1)]


def main() -> None:
    for ring, streams, held in CASES:
        for K in range(0, 4 * ring + 3):
            r = Ring(ring, streams)
            first_walk(r, K, held)
            walk_back(r, K, held, streams)
    print(f"two-phase ring bookkeeping: {len(CASES)} rings x walks of 0 to 4 RING + 2 packs, all consistent")


if __name__ == "__main__":
    main()
