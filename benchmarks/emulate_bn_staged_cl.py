"""The index arithmetic of bn_fwd_staged_cl / bn_bwd_staged_cl (BatchNorm v21) in Python, no
GPU needed: for the plans _batch_norm makes (H200 limits), every (position, channel) of x is
staged once by stage_in's chunks, read by exactly one thread's word in each walk (16-byte
words, and the 8-byte words of the half-precision backward with an activation), and stored
once by stage_out; each warp writes each of red's slots once; the cluster's shares cover the
positions. BatchNorm v24's persistent grid (blocks walking stages, their sums meeting in
global memory): every stage is walked by K blocks of distinct ranks, each writes its own
slot of the scratch's sums (inside staged_cl_scratch's block) and arrives at its stage's
counter once; shapes are also planned for a 4-SM GPU, so that one stage's blocks walk them
all. Mirrors the kernels' loops; change both together.

    python benchmarks/emulate_bn_staged_cl.py
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import numpy  # noqa: E402
from cunorm.ops import _batch_norm as b  # noqa: E402
from cunorm._launch import contiguous_strides  # noqa: E402
from test_batch_norm import _sm_count  # noqa: E402

BLOCK, WARP = 512, 32

def walk_chunks(O, per):
    seen = []
    for t in range(BLOCK):
        o_step, k_step = BLOCK // per, BLOCK - (BLOCK // per) * per
        o, k = t // per, t - (t // per) * per
        while o < O:
            seen.append((t, o, k)); o += o_step; k += k_step
            if k >= per: k -= per; o += 1
    return seen

def emulate(shape, dt, tensors, act=0, sms=132):
    with _sm_count(sms):
        lay = b.layout(shape, contiguous_strides(shape), len(shape) - 1)
        p = b.plan(lay, dt, numpy.dtype(numpy.float32), 0, 0)
    st = p.staged_cl if tensors == 1 else p.staged_cl_bwd
    if st is None:
        return None
    its = dt.itemsize
    O_total, C = lay.O, lay.C
    G, K, OB = st.channels, st.cluster, st.positions
    word_bytes = 8 if (tensors == 2 and act != 0 and its == 2) else 16
    VEC = word_bytes // its
    wshift = st.wshift + (1 if word_bytes == 8 else 0)
    wpp = 1 << wshift
    covered = numpy.zeros((O_total, C), int); walked = numpy.zeros((O_total, C), int); stored = numpy.zeros((O_total, C), int)
    stages = -(-C // G)
    assert st.blocks == stages * K
    launched = st.grid_blocks or st.blocks
    assert launched % K == 0 and launched <= st.blocks
    (parts_len,), acc = b.staged_cl_scratch(st, p.acc) if st.grid else ((0,), None)
    counter_slots = (parts_len - st.blocks * 2 * G) if acc is not None else 0
    arrivals = numpy.zeros(stages, int); slots = {}
    walks = [(blk, stage) for blk in range(launched) for stage in range(blk // K, stages, launched // K)]
    for blk, stage in walks:
        rank = blk % K if K > 1 else 0
        if acc is not None:  # the sums' slot and the arrival, as cl_stage_sums has them
            arrivals[stage] += 1
            slot = stage * K + rank
            assert slot not in slots and (slot + 1) * 2 * G <= st.blocks * 2 * G; slots[slot] = blk
            assert stage * 4 < counter_slots * acc.itemsize  # the counters before the sums
        o0 = rank * OB if K > 1 else 0
        O = max(0, min(OB, O_total - o0)) if K > 1 else O_total
        assert O > 0, (shape, blk)
        c0 = stage * G; count = min(G, C - c0); span = count * its; pitch = G * its
        assert tensors * OB * pitch == st.smem and tensors * O * pitch <= st.smem
        per = -(-span // 16)
        smem = {}  # byte offset -> (o, channel)
        for t, o, k in walk_chunks(O, per):
            nbytes = min(16, span - k * 16)
            for byte in range(16):
                off = o * pitch + k * 16 + byte
                assert off not in smem
                smem[off] = (o0 + o, c0 + (k * 16 + byte) // its) if byte < nbytes else None
        for v in set(v for v in smem.values() if v is not None):
            covered[v] += 1
        # walks: thread t word t % wpp, rows t / wpp step BLOCK / wpp
        red_writes = {}
        for t in range(BLOCK):
            word, row, rows = t & (wpp - 1), t >> wshift, BLOCK >> wshift
            cw = word * VEC
            lane, warp = t % WARP, t // WARP
            if lane < wpp:
                for e in range(VEC):
                    for idx in (warp * 2 * G + cw + e, warp * 2 * G + G + cw + e):
                        assert idx not in red_writes and idx < (BLOCK // WARP) * 2 * (128 // its); red_writes[idx] = t
            if cw >= count:
                continue
            for o in range(row, O, rows):
                for e in range(VEC):
                    if cw + e < count:
                        off = o * pitch + word * word_bytes + e * its
                        assert smem.get(off) == (o0 + o, c0 + cw + e), (shape, t, o, e, smem.get(off))
                        walked[o0 + o, c0 + cw + e] += 1
        assert len(red_writes) == (BLOCK // WARP) * 2 * G
        # stage_out: the same chunks, span bytes a position
        for t, o, k in walk_chunks(O, per):
            nbytes = min(16, span - k * 16)
            for byte in range(0, nbytes, its):
                stored[o0 + o, c0 + (k * 16 + byte) // its] += 1
    assert (covered == 1).all() and (walked == 1).all() and (stored == 1).all(), shape
    if acc is not None:
        assert (arrivals == K).all() and len(slots) == st.blocks, shape
    return st

from cunorm._checks import BFLOAT16  # noqa: E402

shapes = [(2, 3, 3, 8), (1, 13), (4, 5, 7, 16), (3, 17, 23, 64), (5, 25, 21, 40), (9, 29, 23, 72),
          (4, 9, 11, 24), (3, 1, 1, 8), (2, 4, 4, 16), (1, 3), (1, 1, 1, 100)]
n = 0
for shape in shapes + [(9, 29, 23, 200)]:
    for dt in (BFLOAT16, numpy.dtype(numpy.float16), numpy.dtype(numpy.float32), numpy.dtype(numpy.float64)):
        for tensors, act in ((1, 0), (2, 0), (2, 1)):
            for sms in (132, 4):
                st = emulate(shape, dt, tensors, act, sms)
                if st is not None:
                    n += 1
print("ok", n, "cases")
