"""HBM traffic and peak SRAM of every backward pass on tiny shapes, derived by hand.

The random tests hold the simulator equal to the closed forms; here each number is
derived from the algorithm's definition (Dao et al. 2022, Algorithms 3 and 4, and the
buffers each backward module's docstring lists), written as arithmetic a reader can
check, and both the count-only simulator and the prediction must equal it.

Conventions as in tests/test_counts_by_hand.py: elements summed over batch·heads, peak
SRAM of one head, causal masking bottom-right aligned, a pair the causal mask hides
entirely skipped by flash and flash-swapped, never by standard; dropout moves nothing.
"""

import pytest
from helpers import BIG_M, SPARSE, Hand, assert_counts_equal_hand

import iosim
from iosim.variants.flex import causal

CASES = [
    # ------------------------------------------------------------------ flash (Alg. 4) ----
    # K/V blocks outer (line 6), Q blocks inner (line 9). Line 5 writes dQ, dK, dV = 0;
    # line 10 reads Q_i, O_i, dO_i, dQ_i, ℓ_i, m_i and line 21 writes dQ_i per visited pair;
    # line 24 writes dK_j, dV_j once. On chip: K_j, V_j, dK_j, dV_j (B_c·d each), Q_i, O_i,
    # dO_i, dQ_i (B_r·d each), S_ij, dP_ij (B_r·B_c each), ℓ_i, m_i, D_i (B_r each) [+ mask].
    #
    # N_q = N_k = 10, d = 4, B_r = 4, B_c = 3: query blocks 4, 4, 2, key blocks 3, 3, 3, 1
    # (T_c = 4). Every key block meets every query block: T_c·N_q = 40 query rows.
    Hand("flash-ragged", "flash", 4, 3, dict(N=10, d=4, M=BIG_M),
         reads={
             "K": 10 * 4, "V": 10 * 4,  # line 7: once each, N_k·d
             "Q": 40 * 4, "O": 40 * 4, "dO": 40 * 4, "dQ": 40 * 4,  # line 10: T_c·N_q·d each
             "l": 40, "m": 40,  # line 10: T_c·N_q each
         },
         writes={
             "dQ": 10 * 4 + 40 * 4,  # line 5 (N_q·d) + line 21 per pair (T_c·N_q·d)
             "dK": 10 * 4 + 10 * 4, "dV": 10 * 4 + 10 * 4,  # line 5 + line 24, N_k·d each
         },
         # 4·(3·4) + 4·(4·4) + 2·(4·3) + 3·4 = 48 + 64 + 24 + 12
         peak=4 * 3 * 4 + 4 * 4 * 4 + 2 * 4 * 3 + 3 * 4),
    # Causal and an explicit mask, same blocks: as in the forward's hand case, key blocks 0–3
    # meet 10, 10, 6 and 2 query rows (28 in all, 9 of the 12 pairs) and the visited mask
    # tiles hold 10·3 + 10·3 + 6·3 + 2·1 = 80 elements.
    Hand("flash-causal-mask", "flash", 4, 3, dict(N=10, d=4, M=BIG_M, causal=True, mask=True),
         reads={
             "K": 10 * 4, "V": 10 * 4,  # every key block is met (the last row sees every key)
             "Q": 28 * 4, "O": 28 * 4, "dO": 28 * 4, "dQ": 28 * 4,  # per visited pair
             "l": 28, "m": 28,
             "mask": 10 * 3 + 10 * 3 + 6 * 3 + 2 * 1,  # the visited tiles, once each
         },
         writes={"dQ": 10 * 4 + 28 * 4, "dK": 2 * 10 * 4, "dV": 2 * 10 * 4},
         # pair (0, 0) is visited at full size: the working set above plus the 4·3 mask tile
         peak=4 * 3 * 4 + 4 * 4 * 4 + 2 * 4 * 3 + 3 * 4 + 4 * 3),
    # ------------------------------------------------------ flash-swapped (FlashAttention-2) ----
    # First pass per query block: reads O_i, dO_i, ℓ_i, m_i, writes D_i, L_i and dQ_i = 0.
    # Main pass, K/V blocks outer: K_j, V_j read once, dK_j, dV_j written once; per visited
    # pair Q_i, dO_i, dQ_i, L_i, D_i read and dQ_i written. On chip, first pass: O_i, dO_i
    # (B_r·d each), ℓ_i, m_i, D_i, L_i (B_r each); main pass: K_j, V_j, dK_j, dV_j (B_c·d
    # each), Q_i, dO_i, dQ_i (B_r·d each), S_ij, dP_ij (B_r·B_c each), L_i, D_i (B_r each).
    #
    # Same shape and blocks as flash-ragged: 40 visited query rows.
    Hand("swapped-ragged", "flash-swapped", 4, 3, dict(N=10, d=4, M=BIG_M),
         reads={
             "O": 10 * 4, "l": 10, "m": 10,  # first pass, N_q·d and N_q
             "dO": 10 * 4 + 40 * 4,  # first pass + per pair
             "K": 10 * 4, "V": 10 * 4,
             "Q": 40 * 4, "dQ": 40 * 4, "L": 40, "D": 40,  # per pair
         },
         writes={"D": 10, "L": 10, "dQ": 10 * 4 + 40 * 4, "dK": 10 * 4, "dV": 10 * 4},
         # main pass: 4·(3·4) + 3·(4·4) + 2·(4·3) + 2·4 = 48 + 48 + 24 + 8 = 128, above the
         # first pass's 2·(4·4) + 4·4 = 48
         peak=4 * 3 * 4 + 3 * 4 * 4 + 2 * 4 * 3 + 2 * 4),
    # Causal with N_q = 7 > N_k = 3, d = 4, B_r = 4, B_c = 3: query blocks 4, 3, one key block.
    # Rows 0–3 see no key, so only pair (1, 0) is visited, with 3 query rows. The first pass
    # still covers all 7 rows: their D, L and dQ = 0 are written.
    Hand("swapped-causal-Nq>Nk", "flash-swapped", 4, 3, dict(N=7, N_k=3, d=4, M=BIG_M, causal=True),
         reads={
             "O": 7 * 4, "l": 7, "m": 7,  # first pass
             "dO": 7 * 4 + 3 * 4,  # first pass + pair (1, 0)
             "K": 3 * 4, "V": 3 * 4,
             "Q": 3 * 4, "dQ": 3 * 4, "L": 3, "D": 3,  # pair (1, 0)
         },
         writes={"D": 7, "L": 7, "dQ": 7 * 4 + 3 * 4, "dK": 3 * 4, "dV": 3 * 4},
         # pair (1, 0) at 3 × 3: 4·(3·4) + 3·(3·4) + 2·(3·3) + 2·3 = 48 + 36 + 18 + 6 = 108,
         # above the first pass's 2·(4·4) + 4·4 = 48 for the full query block
         peak=4 * 3 * 4 + 3 * 3 * 4 + 2 * 3 * 3 + 2 * 3),
    # --------------------------------------------------------------- standard (Alg. 3) ----
    # Five steps, every tile visited: (1) dV_j on chip, P_ij and dO_i stream: P once, dO once
    # per key block; (2) dO_i once, V_j per query block, dP written; (3) O_i, dO_i once, then
    # P and dP read and dS written; (4) dS read, K_j per query block, dQ written; (5) dS read,
    # Q_i per key block, dK written.
    #
    # N_q = 5, N_k = 7, d = 2, B_r = 2, B_c = 3: query blocks 2, 2, 1 (T_r = 3), key blocks
    # 3, 3, 1 (T_c = 3); batch 2, dropout 0.3: per-head counts times bh = 2.
    Hand("standard-dropout-bh2", "standard", 2, 3, dict(N=5, N_k=7, d=2, M=BIG_M, batch=2, dropout_p=0.3),
         reads={
             "P": 2 * (2 * 5 * 7),  # steps 1 and 3, N_q·N_k each
             "dO": 2 * (3 * 5 * 2 + 5 * 2 + 5 * 2),  # step 1 T_c·N_q·d, steps 2 and 3 N_q·d
             "V": 2 * (3 * 7 * 2), "K": 2 * (3 * 7 * 2),  # steps 2 and 4, T_r·N_k·d each
             "Q": 2 * (3 * 5 * 2),  # step 5, T_c·N_q·d
             "O": 2 * (5 * 2),  # step 3
             "dP": 2 * (5 * 7), "dS": 2 * (2 * 5 * 7),  # step 3; steps 4 and 5
         },
         writes={"dV": 2 * (7 * 2), "dP": 2 * (5 * 7), "dS": 2 * (5 * 7), "dQ": 2 * (5 * 2), "dK": 2 * (7 * 2)},
         # streaming steps: B_r·d + B_c·d + B_r·B_c = 4 + 6 + 6 = 16, above step 3's
         # 2·B_r·d + B_r = 10 and B_r + 2·B_r·B_c = 14
         peak=2 * 2 + 3 * 2 + 2 * 3),
    # ------------------------------------------------------ standard-eager (autograd chain) ----
    # (1) dP_drop = dO Vᵀ: dO once, V per query block; (2) dV = P_dropᵀ dO: P_drop once, dO per
    # key block; (3) dropout: dP_drop and Z read, dP written; (4) softmax backward: P and dP read,
    # dS written; (5) mask and (6) scale: dS read and written each; (7) dQ = dS K and
    # (8) dK = dSᵀ Q: dS read twice, K per query block, Q per key block.
    #
    # Same shape as standard-dropout-bh2 but one head and causal: N_q·N_k = 35, T_r = T_c = 3.
    # R = min(5, ⌊10⁶/15⌋) = 5 rows of P and dP: each read once by step 4.
    Hand("eager-causal-dropout", "standard-eager", 2, 3, dict(N=5, N_k=7, d=2, M=BIG_M, causal=True, dropout_p=0.3),
         reads={
             "dO": 5 * 2 + 3 * 5 * 2,  # step 1 N_q·d, step 2 T_c·N_q·d
             "V": 3 * 7 * 2,  # step 1, T_r·N_k·d
             "P_drop": 35,  # step 2
             "dP_drop": 35, "Z": 35,  # step 3
             "P": 35, "dP": 35,  # step 4
             "dS": 35 + 35 + 2 * 35,  # steps 5, 6, 7 and 8
             "K": 3 * 7 * 2, "Q": 3 * 5 * 2,  # steps 7 and 8
         },
         writes={"dP_drop": 35, "dV": 7 * 2, "dP": 35, "dS": 3 * 35, "dQ": 5 * 2, "dK": 7 * 2},
         # max(matmul steps: 2·2 + 3·2 + 2·3 = 16, steps 3 and 5: 2·(2·3) = 12, step 4: 5·(2·7 + 1) = 75)
         peak=5 * (2 * 7 + 1)),
    # -------------------------------------------- block-sparse (Alg. 4 over a block mask) ----
    # N_q = N_k = 10, d = 4, B_r = 4, B_c = 3 (query blocks 4, 4, 2; key blocks 3, 3, 3, 1) and the
    # block mask [[1, 0, 0, 1], [0, 1, 0, 0], [0, 0, 0, 0]]: nonzero tiles (0, 0), (0, 3), (1, 1),
    # 12 query rows in all. The paper's variant runs lines 7 and 24 for every key block.
    Hand("block-sparse", "block-sparse", 4, 3, dict(N=10, d=4, M=BIG_M, block_sparsity=SPARSE),
         reads={
             "K": 10 * 4, "V": 10 * 4,  # line 7 for every key block
             "Q": 12 * 4, "O": 12 * 4, "dO": 12 * 4, "dQ": 12 * 4, "l": 12, "m": 12,  # line 10 per nonzero tile
         },
         writes={"dQ": 10 * 4 + 12 * 4, "dK": 10 * 4 + 10 * 4, "dV": 10 * 4 + 10 * 4},  # line 5, lines 21, 24
         peak=4 * 3 * 4 + 4 * 4 * 4 + 2 * 4 * 3 + 3 * 4),  # tile (0, 0) at full size, as flash-ragged
    # Skipping the empty key block 2: lines 7 and 24 for key blocks 0, 1, 3 only (7 key rows);
    # dK and dV of key block 2 keep line 5's zeros.
    Hand("block-sparse-skip", "block-sparse-skip", 4, 3, dict(N=10, d=4, M=BIG_M, block_sparsity=SPARSE),
         reads={"K": 7 * 4, "V": 7 * 4, "Q": 12 * 4, "O": 12 * 4, "dO": 12 * 4, "dQ": 12 * 4, "l": 12, "m": 12},
         writes={"dQ": 10 * 4 + 12 * 4, "dK": 10 * 4 + 7 * 4, "dV": 10 * 4 + 7 * 4},
         peak=4 * 3 * 4 + 4 * 4 * 4 + 2 * 4 * 3 + 3 * 4),
    # ------------------------------------------------------------- flex backward ----
    # FlexAttention's backward over a causal block mask, N = 10, d = 2, blocks 4 × 4 (sizes 4, 4, 2): tile (1, 0) full,
    # (0, 0), (1, 1), (2, 0), (2, 1), (2, 2) partial (a ragged block is never full). A first pass reads O, dO, ℓ, m and
    # writes D, L per row. The dQ loop reads Q, dO, L, D once per query block and K, V per visited tile: query blocks
    # 0, 1, 2 meet 4, 8 and 10 key rows (22). The dK, dV loop reads K, V once per key block and Q, dO, L, D per visited
    # tile: key blocks 0, 1, 2 meet 10, 6 and 2 query rows (18). Each loop reads two counts per block of its outer
    # loop and one index per tile.
    Hand("flex-causal", "flex", 4, 4,
         dict(N=10, d=2, M=88, block_mask=iosim.block_mask(causal(10, 10), 10, block=(4, 4))),
         reads={
             "O": 20, "l": 10, "m": 10,  # first pass
             "dO": 20 + 20 + 18 * 2, "L": 10 + 18, "D": 10 + 18,  # first pass, dQ loop, dK, dV loop
             "Q": 20 + 18 * 2, "K": 22 * 2 + 20, "V": 22 * 2 + 20,  # dQ loop's K, V per tile; dK, dV loop's once
             "kv_num_blocks": 3, "full_kv_num_blocks": 3, "q_num_blocks": 3, "full_q_num_blocks": 3,
             "kv_indices": 5, "full_kv_indices": 1, "q_indices": 5, "full_q_indices": 1,
         },
         writes={"D": 10, "L": 10, "dQ": 20, "dK": 20, "dV": 20},
         # the dK, dV loop at a 4 × 4 tile: K_j, V_j, dK_j, dV_j (4·2 each) + Q_i, dO_i (4·2 each), L_i, D_i (4 each)
         # + S_ij, dP_ij (16 each); the dQ loop's is 80, the first pass's 32
         peak=4 * 4 * 2 + 2 * 4 * 2 + 2 * 4 + 2 * 16),
]

IDS = [c.id for c in CASES]


def test_every_backward_pass_is_pinned():
    assert {c.algorithm for c in CASES} == {a.name for a in iosim.ALGORITHMS.values() if a.backward is not None}


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_backward_count_and_prediction_equal_hand(case):
    tiling = iosim.Tiling(Br=case.Br, Bc=case.Bc)
    r = iosim.count(case.algorithm, pass_="bwd", tiling=tiling, **case.shape)
    assert r.tiling == tiling
    assert_counts_equal_hand(case, r.traffic, "count")
    p = iosim.predict(case.algorithm, pass_="bwd", tiling=tiling, **case.shape)
    assert_counts_equal_hand(case, p.exact, "predict")
