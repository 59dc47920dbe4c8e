"""HBM traffic and peak SRAM of every algorithm on tiny shapes, derived by hand.

The random tests hold the simulator equal to the closed forms; a mistake made the
same way in both (dropping the mask reads, or the m̃/ℓ̃ buffers) would pass them.
Here every number is derived from the algorithms' definitions (Dao et al. 2022,
Algorithms 0, 1 and 2, and the buffers each module's docstring lists), written as
the arithmetic a reader can check, and both the simulator (count-only and numeric)
and the prediction must equal it.

Conventions: counts are elements summed over batch·heads; peak SRAM is elements of
one head. Causal masking is bottom-right aligned: query i sees key j exactly when
j ≤ i + N_k − N_q. flash and flash-swapped skip a block pair the causal mask hides
entirely (a skipped pair moves and allocates nothing); standard never skips. An
explicit mask is read once per visited tile. Dropout is regenerated from a counter
on chip, so it changes no traffic and no buffer.
"""

import numpy as np
import pytest
from helpers import BIG_M, SPARSE, Hand, assert_counts_equal_hand

import iosim
from iosim.variants.flex import causal

FLEX_CAUSAL = iosim.block_mask(causal(10, 10), 10, block=(4, 4))  # the flex hand case's block mask

CASES = [
    # ---------------------------------------------------------------- flash (Alg. 1/2) ----
    # K/V blocks outer (line 6), Q blocks inner (line 8); line 3 writes O = 0, ℓ = 0, m = −inf.
    # On chip: K_j, V_j (B_c·d each), Q_i, O_i (B_r·d each), S_ij (B_r·B_c, P̃_ij in place),
    # ℓ_i, m_i, m̃_ij, ℓ̃_ij, m_new, ℓ_new (B_r each) [+ mask tile B_r·B_c].
    #
    # N_q = N_k = 10, d = 4, B_r = 4, B_c = 3: query blocks 4, 4, 2 (T_r = 3), key blocks
    # 3, 3, 3, 1 (T_c = 4). Every key block meets every query block: T_c·N_q = 4·10 = 40 query rows.
    Hand("flash-ragged", "flash", 4, 3, dict(N=10, d=4, M=BIG_M),
         reads={
             "K": 10 * 4, "V": 10 * 4,  # line 7: K_j, V_j read once each, N_k·d
             "Q": 4 * 10 * 4, "O": 4 * 10 * 4,  # line 9: Q_i, O_i once per (i, j), T_c·N_q·d
             "l": 4 * 10, "m": 4 * 10,  # line 9: ℓ_i, m_i once per (i, j), T_c·N_q
         },
         writes={
             "O": 10 * 4 + 4 * 10 * 4,  # line 3 zeros (N_q·d) + line 15 per (i, j) (T_c·N_q·d)
             "l": 10 + 4 * 10, "m": 10 + 4 * 10,  # line 3 (N_q) + line 16 per (i, j) (T_c·N_q)
         },
         # K_j, V_j (2·3·4) + Q_i, O_i (2·4·4) + S_ij (4·3) + six statistics (6·4) = 24 + 32 + 12 + 24
         peak=2 * 3 * 4 + 2 * 4 * 4 + 4 * 3 + 6 * 4),
    # Causal and an explicit mask, same blocks. N_q = N_k: query i sees key j ≤ i. Key block j
    # (first key c) meets the query blocks from the one holding row c on:
    #   j = 0, keys 0–2: rows ≥ 0, query blocks 0, 1, 2: 4 + 4 + 2 = 10 rows
    #   j = 1, keys 3–5: rows ≥ 3, query blocks 0, 1, 2 (row 3 sees key 3): 10 rows
    #   j = 2, keys 6–8: rows ≥ 6, query blocks 1, 2: 4 + 2 = 6 rows
    #   j = 3, key 9:    rows ≥ 9, query block 2: 2 rows
    # Visited query rows: 10 + 10 + 6 + 2 = 28 (9 of the 12 pairs). Visited mask tiles,
    # Σ b_i·b_j: 10·3 + 10·3 + 6·3 + 2·1 = 80.
    Hand("flash-causal-mask", "flash", 4, 3, dict(N=10, d=4, M=BIG_M, causal=True, mask=True),
         reads={
             "K": 10 * 4, "V": 10 * 4,  # every key block is met (the last row sees every key): N_k·d
             "Q": 28 * 4, "O": 28 * 4,  # per visited pair: visited rows·d
             "l": 28, "m": 28,  # per visited pair: visited rows
             "mask": 10 * 3 + 10 * 3 + 6 * 3 + 2 * 1,  # the visited tiles, once each
         },
         writes={
             "O": 10 * 4 + 28 * 4,  # line 3 (N_q·d) + line 15 per visited pair
             "l": 10 + 28, "m": 10 + 28,  # line 3 (N_q) + line 16 per visited pair
         },
         # pair (0, 0) is visited at full size: the working set with the mask tile:
         # K_j, V_j (2·3·4) + Q_i, O_i (2·4·4) + S_ij (4·3) + statistics (6·4) + mask tile (4·3)
         peak=2 * 3 * 4 + 2 * 4 * 4 + 4 * 3 + 6 * 4 + 4 * 3),
    # Causal with N_q = 7 > N_k = 3, d = 4, B_r = 4, B_c = 3: query blocks 4, 3, key block 3.
    # Offset N_k − N_q = −4: query i sees key j ≤ i − 4, so rows 0–3 see no key and query
    # block 0 (rows 0–3) is hidden entirely. Key block 0 (keys 0–2) is first seen by row 4:
    # only pair (1, 0) is visited, 3 query rows.
    Hand("flash-causal-Nq>Nk", "flash", 4, 3, dict(N=7, N_k=3, d=4, M=BIG_M, causal=True),
         reads={
             "K": 3 * 4, "V": 3 * 4,  # N_k·d
             "Q": 3 * 4, "O": 3 * 4,  # pair (1, 0): b_1·d
             "l": 3, "m": 3,  # b_1
         },
         writes={
             "O": 7 * 4 + 3 * 4,  # line 3 initializes all N_q rows, fully masked ones included
             "l": 7 + 3, "m": 7 + 3,
         },
         # only pair (1, 0) allocates, with b_1 = 3 rows: K_j, V_j (2·3·4) + Q_i, O_i (2·3·4) +
         # S_ij (3·3) + statistics (6·3) = 24 + 24 + 9 + 18 = 75, below W(4, 3) = 92; line 3's
         # zero tiles (at most 4·4) are smaller
         peak=2 * 3 * 4 + 2 * 3 * 4 + 3 * 3 + 6 * 3),
    # Dropout p = 0.3, N_q = 5 < N_k = 11, d = 3, B_r = 2, B_c = 4, batch 2 × heads 3 (bh = 6):
    # query blocks 2, 2, 1 (T_r = 3), key blocks 4, 4, 3 (T_c = 3). Dropout moves nothing:
    # these are the no-dropout counts, per head times bh = 6.
    Hand("flash-dropout-bh6", "flash", 2, 4, dict(N=5, N_k=11, d=3, M=BIG_M, batch=2, heads=3, dropout_p=0.3),
         reads={
             "K": 6 * (11 * 3), "V": 6 * (11 * 3),  # N_k·d per head
             "Q": 6 * (3 * 5 * 3), "O": 6 * (3 * 5 * 3),  # T_c·N_q·d per head
             "l": 6 * (3 * 5), "m": 6 * (3 * 5),  # T_c·N_q per head
         },
         writes={
             "O": 6 * (5 * 3 + 3 * 5 * 3),  # (N_q·d + T_c·N_q·d) per head
             "l": 6 * (5 + 3 * 5), "m": 6 * (5 + 3 * 5),
         },
         # per head: K_j, V_j (2·4·3) + Q_i, O_i (2·2·3) + S_ij (2·4) + statistics (6·2) = 24 + 12 + 8 + 12
         peak=2 * 4 * 3 + 2 * 2 * 3 + 2 * 4 + 6 * 2),
    # -------------------------------------------------------- flash-swapped (Q outer) ----
    # Q blocks outer, K/V blocks inner. Q_i is read once; O_i, ℓ_i, m_i start on chip and are
    # written once; K_j, V_j are read once per (i, j). Nothing reads O, ℓ or m.
    # On chip: Q_i, O_i (B_r·d each), ℓ_i, m_i (B_r each) for the whole inner loop, and per pair
    # K_j, V_j (B_c·d each), S_ij (B_r·B_c), m_new, ℓ̃_ij (B_r each) [+ mask tile B_r·B_c].
    #
    # N_q = N_k = 10, d = 4, B_r = 4, B_c = 3: T_r = 3 query blocks (4, 4, 2), each meets all of K.
    Hand("swapped-ragged", "flash-swapped", 4, 3, dict(N=10, d=4, M=BIG_M),
         reads={
             "Q": 10 * 4,  # N_q·d
             "K": 3 * 10 * 4, "V": 3 * 10 * 4,  # T_r·N_k·d
         },
         writes={"O": 10 * 4, "l": 10, "m": 10},  # N_q·d, N_q, N_q
         # Q_i, O_i (2·4·4) + ℓ_i, m_i (2·4) + K_j, V_j (2·3·4) + S_ij (4·3) + m_new, ℓ̃ (2·4)
         peak=2 * 4 * 4 + 2 * 4 + 2 * 3 * 4 + 4 * 3 + 2 * 4),
    # Causal and an explicit mask, same blocks; query i sees key j ≤ i. Query block i (last row r)
    # meets the key blocks up to the one holding key r:
    #   i = 0, rows 0–3, last key 3: key blocks 0, 1 = 3 + 3 = 6 key rows
    #   i = 1, rows 4–7, last key 7: key blocks 0, 1, 2 = 9 key rows
    #   i = 2, rows 8–9, last key 9: all four = 10 key rows
    # Visited key rows 6 + 9 + 10 = 25; visited mask tiles Σ b_i·(key rows) = 4·6 + 4·9 + 2·10 = 80.
    Hand("swapped-causal-mask", "flash-swapped", 4, 3, dict(N=10, d=4, M=BIG_M, causal=True, mask=True),
         reads={
             "Q": 10 * 4,  # every Q_i is read, N_q·d
             "K": 25 * 4, "V": 25 * 4,  # visited key rows·d
             "mask": 4 * 6 + 4 * 9 + 2 * 10,
         },
         writes={"O": 10 * 4, "l": 10, "m": 10},
         # pair (0, 0) at full size: Q_i, O_i (2·4·4) + ℓ_i, m_i (2·4) + K_j, V_j (2·3·4) + S_ij (4·3) +
         # m_new, ℓ̃ (2·4) + mask tile (4·3) = 32 + 8 + 24 + 12 + 8 + 12
         peak=2 * 4 * 4 + 2 * 4 + 2 * 3 * 4 + 4 * 3 + 2 * 4 + 4 * 3),
    # Causal with N_q = 7 > N_k = 3, d = 4, B_r = 4, B_c = 3 (offset −4): query block 0 (rows 0–3,
    # last key 3 − 4 = −1) meets no key block; query block 1 (rows 4–6, 3 rows) meets key block 0.
    Hand("swapped-causal-Nq>Nk", "flash-swapped", 4, 3, dict(N=7, N_k=3, d=4, M=BIG_M, causal=True),
         reads={
             "Q": 7 * 4,  # Q_i is loaded for every query block, the hidden one included
             "K": 3 * 4, "V": 3 * 4,  # key block 0 once, for query block 1
         },
         writes={"O": 7 * 4, "l": 7, "m": 7},  # the hidden block writes its zeros, ℓ = 0, m = −inf
         # block 0 holds Q_i, O_i, ℓ_i, m_i only: 2·4·4 + 2·4 = 40; block 1 (3 rows) holds
         # Q_i, O_i (2·3·4) + ℓ_i, m_i (2·3) + K_j, V_j (2·3·4) + S_ij (3·3) + m_new, ℓ̃ (2·3)
         # = 24 + 6 + 24 + 9 + 6 = 69, the peak (W(4, 3) = 84 is never reached)
         peak=2 * 3 * 4 + 2 * 3 + 2 * 3 * 4 + 3 * 3 + 2 * 3),
    # Mask and dropout p = 0.3, N_q = 5 < N_k = 11, d = 3, B_r = 2, B_c = 4, heads 2 (bh = 2):
    # T_r = 3 query blocks (2, 2, 1), each meets all 11 key rows. Dropout moves nothing.
    Hand("swapped-mask-dropout-bh2", "flash-swapped", 2, 4,
         dict(N=5, N_k=11, d=3, M=BIG_M, heads=2, mask=True, dropout_p=0.3),
         reads={
             "Q": 2 * (5 * 3),  # N_q·d per head
             "K": 2 * (3 * 11 * 3), "V": 2 * (3 * 11 * 3),  # T_r·N_k·d per head
             "mask": 2 * (5 * 11),  # every tile once: N_q·N_k per head
         },
         writes={"O": 2 * (5 * 3), "l": 2 * 5, "m": 2 * 5},
         # Q_i, O_i (2·2·3) + ℓ_i, m_i (2·2) + K_j, V_j (2·4·3) + S_ij (2·4) + m_new, ℓ̃ (2·2) +
         # mask tile (2·4) = 12 + 4 + 24 + 8 + 4 + 8
         peak=2 * 2 * 3 + 2 * 2 + 2 * 4 * 3 + 2 * 4 + 2 * 2 + 2 * 4),
    # ------------------------------------------------------------- standard (Alg. 0) ----
    # Step 1: per query block read Q_i, per key block read K_j [and the mask tile], write S_ij.
    # Step 2: R = ⌊M/(N_k + 2)⌋ whole rows of S (with their m, ℓ) on chip, capped at N_q: read S
    # once, write P. If R = 0, two-pass online softmax on B_r × B_c tiles: S read twice.
    # Step 3: per query block, O_i on chip while P_ij and V_j stream past; write O_i.
    # Standard never skips a tile, causal or not.
    # On chip: step 1 Q_i (B_r·d), K_j (B_c·d), S_ij (B_r·B_c) [+ mask tile B_r·B_c];
    # step 2 R·(N_k + 2), or S_ij + m_i, ℓ_i, m̃_ij, ℓ̃_ij (B_r·B_c + 4·B_r);
    # step 3 O_i (B_r·d), P_ij (B_r·B_c), V_j (B_c·d).
    #
    # N_q = N_k = 10, d = 4, B_r = 4, B_c = 3 (T_r = 3), M = 50: R = ⌊50/12⌋ = 4 rows of S at a
    # time (row blocks 4, 4, 2), so S is read once.
    Hand("standard-rows-ragged", "standard", 4, 3, dict(N=10, d=4, M=50),
         reads={
             "Q": 10 * 4,  # step 1: N_q·d
             "K": 3 * 10 * 4,  # step 1: all of K per query block, T_r·N_k·d
             "S": 10 * 10,  # step 2: once
             "P": 10 * 10,  # step 3
             "V": 3 * 10 * 4,  # step 3: all of V per query block, T_r·N_k·d
         },
         writes={"S": 10 * 10, "P": 10 * 10, "O": 10 * 4},
         # step 1: Q_i + K_j + S_ij = 16 + 12 + 12 = 40; step 2: R·(N_k + 2) = 4·12 = 48;
         # step 3: O_i + P_ij + V_j = 16 + 12 + 12 = 40
         peak=4 * (10 + 2)),
    # Causal and an explicit mask, same shape, M = 60: the mask tile raises step 1 to
    # 16 + 12 + 12 + 12 = 52, and R = ⌊60/12⌋ = 5 rows (row blocks 5, 5). Nothing is skipped:
    # the counts are the unmasked ones plus every mask tile once.
    Hand("standard-causal-mask", "standard", 4, 3, dict(N=10, d=4, M=60, causal=True, mask=True),
         reads={
             "Q": 10 * 4, "K": 3 * 10 * 4,  # step 1, hidden tiles included
             "mask": 10 * 10,  # step 1: every tile, N_q·N_k
             "S": 10 * 10, "P": 10 * 10, "V": 3 * 10 * 4,
         },
         writes={"S": 10 * 10, "P": 10 * 10, "O": 10 * 4},
         # max(step 1: 16 + 12 + 12 + 12 = 52, step 2: 5·12 = 60, step 3: 40)
         peak=5 * (10 + 2)),
    # No row fits: N_q = 5, N_k = 31, d = 2, B_r = 2, B_c = 3, mask, M = 32 < N_k + 2 = 33, so
    # R = 0 and the softmax takes two passes over S. Query blocks 2, 2, 1 (T_r = 3); key blocks
    # ten of 3 and one of 1 (T_c = 11).
    Hand("standard-two-pass-mask", "standard", 2, 3, dict(N=5, N_k=31, d=2, M=32, mask=True),
         reads={
             "Q": 5 * 2,  # N_q·d
             "K": 3 * 31 * 2, "V": 3 * 31 * 2,  # T_r·N_k·d each
             "mask": 5 * 31,  # N_q·N_k
             "S": 2 * 5 * 31,  # two passes: 2·N_q·N_k
             "P": 5 * 31,
         },
         writes={"S": 5 * 31, "P": 5 * 31, "O": 5 * 2},
         # step 1: Q_i (2·2) + K_j (3·2) + mask tile (2·3) + S_ij (2·3) = 4 + 6 + 6 + 6 = 22;
         # step 2: S_ij (2·3) + m_i, ℓ_i, m̃, ℓ̃ (4·2) = 14; step 3: O_i (4) + P_ij (6) + V_j (6) = 16
         peak=2 * 2 + 3 * 2 + 2 * 3 + 2 * 3),
    # Causal, N_q = 7 > N_k = 3 (rows 0–3 see no key), dropout p = 0.25, batch 2 (bh = 2),
    # d = 4, B_r = 4, B_c = 3, M = 100: query blocks 4, 3 (T_r = 2), one key block. R = ⌊100/5⌋ = 20,
    # capped at the N_q = 7 rows there are. Query block 0 is hidden but still computed and stored;
    # dropout moves nothing.
    Hand("standard-causal-Nq>Nk-dropout-bh2", "standard", 4, 3,
         dict(N=7, N_k=3, d=4, M=100, batch=2, causal=True, dropout_p=0.25),
         reads={
             "Q": 2 * (7 * 4),  # N_q·d per head
             "K": 2 * (2 * 3 * 4), "V": 2 * (2 * 3 * 4),  # T_r·N_k·d per head, the hidden block included
             "S": 2 * (7 * 3), "P": 2 * (7 * 3),  # N_q·N_k per head
         },
         writes={"S": 2 * (7 * 3), "P": 2 * (7 * 3), "O": 2 * (7 * 4)},
         # max(step 1: Q_i (16) + K_j (12) + S_ij (12) = 40, step 2: 7·(3 + 2) = 35, step 3: 16 + 12 + 12 = 40)
         peak=4 * 4 + 3 * 4 + 4 * 3),
    # ------------------------------------------------------ standard-eager (op by op) ----
    # Six passes, every tile visited: (1) S = QKᵀ as Alg. 0 step 1; (2) scale: S read and
    # written; (3) mask: S read and written; (4) softmax: S read, P written; (5) dropout: P
    # read, P_drop and the one-byte keep-mask Z written; (6) O = P_drop V as Alg. 0 step 3.
    #
    # N_q = 5, N_k = 7, d = 2, B_r = 2, B_c = 3, causal, dropout 0.3: query blocks 2, 2, 1
    # (T_r = 3), N_q·N_k = 35. R = min(5, ⌊10⁶/9⌋) = 5 rows: S read once by the softmax.
    Hand("eager-causal-dropout", "standard-eager", 2, 3, dict(N=5, N_k=7, d=2, M=BIG_M, causal=True, dropout_p=0.3),
         reads={
             "Q": 5 * 2, "K": 3 * 7 * 2,  # step 1: N_q·d, T_r·N_k·d
             "S": 3 * 35,  # steps 2, 3, 4
             "P": 35,  # step 5
             "P_drop": 35, "V": 3 * 7 * 2,  # step 6
         },
         writes={"S": 3 * 35, "P": 35, "P_drop": 35, "Z": 35, "O": 5 * 2},  # steps 1-3, 4, 5, 5, 6
         # max(steps 1, 6: 2·2 + 3·2 + 2·3 = 16, steps 3, 5: 2·(2·3) = 12, step 4: 5·(7 + 2) = 45)
         peak=5 * (7 + 2)),
    # ---------------------------------------------- block-sparse (Alg. 2 over a block mask) ----
    # N_q = N_k = 10, d = 4, B_r = 4, B_c = 3 as flash-ragged (query blocks 4, 4, 2; key blocks
    # 3, 3, 3, 1), block mask [[1, 0, 0, 1], [0, 1, 0, 0], [0, 0, 0, 0]]: tiles (0, 0) 4 × 3,
    # (0, 3) 4 × 1 and (1, 1) 4 × 3 are nonzero, 4 + 4 + 4 = 12 query rows in all; key block 2
    # and query block 2 have no nonzero tile. The paper's variant loads every K_j, V_j.
    Hand("block-sparse", "block-sparse", 4, 3, dict(N=10, d=4, M=BIG_M, block_sparsity=SPARSE),
         reads={
             "K": 10 * 4, "V": 10 * 4,  # line 7 for every key block
             "Q": 12 * 4, "O": 12 * 4, "l": 12, "m": 12,  # line 9 per nonzero tile
         },
         writes={"O": 10 * 4 + 12 * 4, "l": 10 + 12, "m": 10 + 12},  # line 3, then lines 15-16 per nonzero tile
         # tile (0, 0): K_j, V_j (2·3·4) + Q_i, O_i (2·4·4) + S_ij (4·3) + statistics (6·4) = 92
         peak=2 * 3 * 4 + 2 * 4 * 4 + 4 * 3 + 6 * 4),
    # The same, skipping the empty key block 2: K and V read for key blocks 0, 1, 3 (3 + 3 + 1 rows).
    Hand("block-sparse-skip", "block-sparse-skip", 4, 3, dict(N=10, d=4, M=BIG_M, block_sparsity=SPARSE),
         reads={"K": 7 * 4, "V": 7 * 4, "Q": 12 * 4, "O": 12 * 4, "l": 12, "m": 12},
         writes={"O": 10 * 4 + 12 * 4, "l": 10 + 12, "m": 10 + 12},
         peak=2 * 3 * 4 + 2 * 4 * 4 + 4 * 3 + 6 * 4),
    # ------------------------------------------------------------ split-kv (Flash-Decoding) ----
    # Decoding with grouped-query attention: batch 1, heads 4 sharing kv_heads = 2 (G = 2), N_q = 1,
    # N_k = 10, d = 4, with a mask. Each K/V head's group packs into G·N_q = 2 query rows: one query
    # block of B_r = 2 (T_r = 1). Key blocks of B_c = 3: 3, 3, 3, 1 (T_c = 4), dealt to S = 3 splits as
    # divmod(4, 3) = (1, 1): split 0 takes blocks 0, 1 (6 keys), split 1 block 2, split 2 block 3.
    # Per K/V head, then ×2 K/V heads:
    Hand("split-kv-gqa", "split-kv", 2, 3, dict(N=1, N_k=10, d=4, M=BIG_M, heads=4, kv_heads=2, mask=True),
         reads={
             "Q": 2 * 3 * 2 * 4,  # every split loads the query block: S·G·N_q·d
             "K": 2 * 10 * 4, "V": 2 * 10 * 4,  # each key once per K/V head, for both query heads of the group
             "mask": 2 * 2 * 10,  # each (packed row, key) once: G·N_q·N_k
             "O_split": 2 * 3 * 2 * 4, "lse_split": 2 * 3 * 2,  # the combine reads back every split's partials
         },
         writes={
             "O_split": 2 * 3 * 2 * 4, "lse_split": 2 * 3 * 2,  # each split writes its O_s (normalized) and lse_s
             "O": 2 * 2 * 4, "l": 2 * 2, "m": 2 * 2,  # the combine writes O, ℓ, m once
         },
         # a tile: Q_i, O_i (2·2·4) + K_j, V_j (2·3·4) + S_ij (2·3) + 4 statistics (4·2) + mask tile (2·3) = 60;
         # the combine's O_i, O_s (2·2·4) + ℓ_i, m_i, lse_s, m_new (4·2) = 24 is less
         peak=2 * 2 * 4 + 2 * 3 * 4 + 2 * 3 + 4 * 2 + 2 * 3, splits=3),
    # ---------------------------------------------------------------- small-cache ----
    # Step 1: per (i, j) tile, S_ij on chip while d streams past one column of Q_i (b_i) and of
    # K_j (b_j) at a time; then [the mask tile and] write S_ij. Step 2 as in standard. Step 3: per
    # query block i and column block of O (B_d = min(B_c, d) columns), O_i on chip while N_k
    # streams past one column of P_i (b_i) and one row of V (b_d) at a time; write O_i.
    # On chip: step 1 S_ij + max(b_i + b_j, mask tile); step 3 O_i (B_r·B_d) + B_r + B_d.
    #
    # N_q = N_k = 10, d = 4, B_r = 4, B_c = 3: T_r = 3, T_c = 4, B_d = 3 so column blocks 3, 1
    # (T_d = 2). M = 50: R = ⌊50/12⌋ = 4 rows of S at a time, S read once.
    Hand("small-cache-ragged", "small-cache", 4, 3, dict(N=10, d=4, M=50),
         reads={
             "Q": 4 * 10 * 4,  # step 1: Q_i's d columns once per key block, T_c·N_q·d
             "K": 3 * 10 * 4,  # step 1: K_j's d columns once per query block, T_r·N_k·d
             "S": 10 * 10,  # step 2: once
             "P": 2 * 10 * 10,  # step 3: all of P once per column block of O, T_d·N_q·N_k
             "V": 3 * 10 * 4,  # step 3: all of V once per query block, T_r·N_k·d
         },
         writes={"S": 10 * 10, "P": 10 * 10, "O": 10 * 4},
         # step 1: S_ij (12) + columns (4 + 3) = 19; step 2: 4·(10 + 2) = 48; step 3: O_i (4·3) + 4 + 3 = 19
         peak=4 * (10 + 2)),
    # Causal and an explicit mask, two heads, no row fits: N_q = 5, N_k = 31, d = 2, B_r = 2, B_c = 3,
    # M = 32 < N_k + 2, so R = 0 and S is read twice. T_r = 3, T_c = 11, B_d = min(3, 2) = 2 (T_d = 1).
    # Nothing is skipped.
    Hand("small-cache-two-pass-causal-mask-bh2", "small-cache", 2, 3,
         dict(N=5, N_k=31, d=2, M=32, heads=2, causal=True, mask=True),
         reads={
             "Q": 2 * (11 * 5 * 2), "K": 2 * (3 * 31 * 2),  # T_c·N_q·d, T_r·N_k·d per head
             "mask": 2 * (5 * 31),  # every tile once
             "S": 2 * (2 * 5 * 31),  # two passes
             "P": 2 * (1 * 5 * 31), "V": 2 * (3 * 31 * 2),  # T_d·N_q·N_k, T_r·N_k·d per head
         },
         writes={"S": 2 * (5 * 31), "P": 2 * (5 * 31), "O": 2 * (5 * 2)},
         # step 1: S_ij (6) + mask tile (6) = 12 > S_ij + columns (6 + 5); step 2: S_ij (6) + 4·2 = 14;
         # step 3: O_i (2·2) + 2 + 2 = 8
         peak=2 * 3 + 4 * 2),
    # FlexAttention over a causal block mask: N = 10, d = 2, blocks of 4 × 4 (sizes 4, 4, 2). Below the diagonal,
    # (1, 0) is full; (2, 0) and (2, 1) attend everywhere but have 2 rows, and a ragged block is never full (torch
    # pads the mask with False), so they are partial like the diagonal's; above it empty. Query blocks 0, 1, 2 visit
    # key rows 4, 4 + 4, 4 + 4 + 2: K and V read 22 rows of d. Two counts per query block, one index per tile.
    Hand("flex-causal", "flex", 4, 4,
         dict(N=10, d=2, M=64, block_mask=FLEX_CAUSAL),
         reads={"Q": 10 * 2, "K": 22 * 2, "V": 22 * 2, "kv_num_blocks": 3, "full_kv_num_blocks": 3,
                "kv_indices": 5, "full_kv_indices": 1},
         writes={"O": 10 * 2, "l": 10, "m": 10},
         # a 4 × 4 tile: Q_i, O_i (4·2 each), K_j, V_j (4·2 each), S_ij (16), ℓ_i, m_i, m_new, ℓ̃ (4 each)
         peak=4 * 2 * 4 + 16 + 4 * 4),
]

IDS = [c.id for c in CASES]


def test_every_algorithm_is_pinned():
    pinned = {c.algorithm for c in CASES}
    assert pinned == set(iosim.ALGORITHMS), f"hand cases cover {sorted(pinned)}, registry {sorted(iosim.ALGORITHMS)}"


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_count_only_equals_hand(case):
    r = iosim.count(case.algorithm, tiling=case.tiling, **case.shape)
    assert (r.tiling.Br, r.tiling.Bc) == (case.Br, case.Bc), f"{case.id}: tiling {r.tiling}"
    assert_counts_equal_hand(case, r.traffic, "count")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_prediction_equals_hand(case):
    p = iosim.predict(case.algorithm, tiling=case.tiling, **case.shape)
    assert_counts_equal_hand(case, p.exact, "predict")


def inputs(case: Hand):
    """Random Q, K, V and, when the case has one, a fixed mask with hidden and visible keys."""
    s = case.shape
    n_q, n_k, d = s["N"], s.get("N_k", s["N"]), s["d"]
    batch, heads = s.get("batch", 1), s.get("heads", 1)
    rng = np.random.default_rng(2026)
    q = rng.standard_normal((batch, heads, n_q, d))
    kv_heads = s.get("kv_heads", heads)
    k = rng.standard_normal((batch, kv_heads, n_k, d))
    v = rng.standard_normal((batch, kv_heads, n_k, d))
    i, j = np.arange(n_q)[:, None], np.arange(n_k)[None, :]
    mask = (i + 2 * j) % 3 != 0 if s.get("mask") else None  # (N_q, N_k)
    return q, k, v, mask


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_numeric_run_equals_hand(case):
    q, k, v, mask = inputs(case)
    opts = {key: case.shape[key] for key in ("causal", "dropout_p") if key in case.shape}
    sparsity, flex = case.shape.get("block_sparsity"), case.shape.get("block_mask")
    r = iosim.simulate(case.algorithm, q, k, v, M=case.shape["M"], mask=mask, block_sparsity=sparsity,
                       block_mask=flex, tiling=case.tiling, seed=5, **opts)
    if flex is not None:  # the mask function's own mask
        mask = flex.element_mask()
    assert_counts_equal_hand(case, r.traffic, "simulate")
    if sparsity is not None:  # every element of a zero tile is masked out
        blocks = np.array(sparsity.blocks)
        tiles = np.kron(blocks, np.ones((case.Br, case.Bc), dtype=bool))[:q.shape[2], :k.shape[2]]
        mask = tiles if mask is None else mask & tiles
    ref = iosim.attention_ref(q, k, v, mask=mask, seed=5, **opts)
    np.testing.assert_allclose(r.out, ref.out, rtol=1e-10, atol=1e-12, err_msg=f"{case.id}: output")
