"""Launch configurations: one place for every threshold the dispatcher uses.

A row (or, on the split path, a tile of a row) is held in registers by a group of ``tpr``
threads, each holding ``packs`` packs of ``vec`` elements. These functions pick the group
from the row length; ``all_tile_configs`` enumerates every configuration they can return,
so CI compiles exactly what the dispatcher may launch.

Thresholds are first choices from the register budget, not yet tuned on a GPU: the
measurements that move them belong in benchmarks/NOTES.md and the comment next to each.
"""
from __future__ import annotations

import dataclasses
import functools

# At most 16 values per thread in registers: with x, dy and two gradient accumulators per
# value (backward), 16 keeps a 512-thread block under the 128 registers a thread may use
# at that size without spilling. Packs of 16 bytes give the widest single memory access.
MAX_VALUES_PER_THREAD = 16
MAX_PACK_BYTES = 16
MAX_PACKS = 4

# A block of 1024 threads may use 64 registers each: enough for forward (one value array),
# too few for backward's four arrays, so backward stops at 512.
FWD_MAX_TPR = 1024
BWD_MAX_TPR = 512

# Rows shorter than a warp's worth of packs share a 128-thread block (4 warps) between
# several rows, so the scheduler has whole warps to hide latency with.
SMALL_ROW_BLOCK = 128

# Split path (rows longer than one register tile): one 256-thread block per tile.
SPLIT_TPR = 256

# Forward grid-stride loops start at most this many blocks (rows beyond are looped over).
MAX_GRID = 1 << 20


@dataclasses.dataclass(frozen=True)
class TileConfig:
    vec: int
    packs: int
    tpr: int

    @property
    def block(self) -> int:
        return max(SMALL_ROW_BLOCK, self.tpr)

    @property
    def rows_per_block(self) -> int:
        return self.block // self.tpr

    @property
    def tile(self) -> int:
        return self.tpr * self.packs * self.vec


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def max_vec(itemsize: int) -> int:
    return MAX_PACK_BYTES // itemsize


def packs_cap(vec: int) -> int:
    return max(1, min(MAX_PACKS, MAX_VALUES_PER_THREAD // vec))


def row_config(n: int, vec: int, max_tpr: int) -> TileConfig | None:
    """The register tile that holds a whole row of ``n`` elements, or None (split path)."""
    packs_total = -(-n // vec)
    pmax = packs_cap(vec)
    if packs_total <= 32:
        return TileConfig(vec, 1, _next_pow2(packs_total))
    if packs_total <= 32 * pmax:
        return TileConfig(vec, _next_pow2(-(-packs_total // 32)), 32)
    tpr = max(128, _next_pow2(-(-packs_total // pmax)))
    if tpr > max_tpr:
        return None
    return TileConfig(vec, _next_pow2(-(-packs_total // tpr)), tpr)


def split_config(vec: int) -> TileConfig:
    return TileConfig(vec, packs_cap(vec), SPLIT_TPR)


@functools.lru_cache(maxsize=None)
def vec_choices(itemsize: int) -> tuple[int, ...]:
    """Vector widths the dispatcher uses: the widest pack, or scalar when alignment forbids."""
    return (1, max_vec(itemsize)) if max_vec(itemsize) > 1 else (1,)


def all_tile_configs(vec: int, max_tpr: int) -> list[TileConfig]:
    """Every full-row config ``row_config`` can return for this vec and limit."""
    seen = []
    n = 1
    while True:
        cfg = row_config(n, vec, max_tpr)
        if cfg is None:
            return seen
        if cfg not in seen:
            seen.append(cfg)
        n += vec
