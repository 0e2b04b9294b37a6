"""Probe (GPU run 71): issue 33 item 3's rows through bench_paged.case -- several queries per sequence
against a paged cache (GQA 32/8, d 128, block 16, q token-major), the default plan (by tokens for 2-4
queries, the prefix + tail split for 5-16 over >= 2048 keys) beside cuDNN's general kernel and SDPA on
the gathered cache, back to back and CUDA-graph replayed, with the share of the copy ceiling."""
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import bench_paged  # noqa: E402

import stridedfa  # noqa: E402

rows = []
# (batch, keys, queries, the split's fewest queries): 5 is the default; 3 puts the split beside the
# default's by tokens at 3-4 queries, 9 gives 5-8 queries at batch 1 back to by tokens.
for batch, length, queries, least in ((8, 8192, 8, 5), (8, 8192, 16, 5), (32, 8192, 8, 5), (32, 8192, 16, 5),
                                      (8, 8192, 5, 5), (1, 8192, 8, 5), (1, 8192, 8, 9), (8, 2048, 8, 5),
                                      (8, 8192, 4, 5), (8, 8192, 4, 3), (32, 8192, 4, 3), (8, 8192, 3, 5),
                                      (8, 8192, 3, 3), (8, 2048, 4, 3), (1, 8192, 5, 9)):
    stridedfa._core._decode_prefix_tail(min_queries=least)
    try:
        row = bench_paged.case(batch, length, 3, 20, queries)
        row["prefix_tail_min_queries"] = least
    except Exception as error:  # refused or out of memory: say so, keep going
        row = {"batch": batch, "cache_length": length, "queries": queries, "error": f"{type(error).__name__}: {error}"[:300]}
    g = row.get("graphed", {})
    print(batch, length, queries, least, {k: round(v, 3) for k, v in row.items() if isinstance(v, float)},
          {k: round(v, 3) for k, v in g.items() if isinstance(v, float)}, row.get("error", ""), flush=True)
    rows.append(row)
    torch.cuda.empty_cache()
    json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "probe71.json"), "w"), indent=1)
