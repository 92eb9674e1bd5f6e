"""Decoding: text from a model at the depth you choose, and what it costs.

The library, bottom up (each route calls the model's one forward step, ``Decoder.step``):
    sampling.py        greedy / temperature / top-k / top-p, one seeded stream per sequence
    transcripts.py     what each sequence wrote, stop strings, counts and clocks
    static_route.py    full, early exit, skip set, exit adapter: the same blocks every token
    dynamic_exit.py    per-token confident early exit (CALM), and its teacher-forced twin
    batch.py           batched, left-padded decoding with the KV cache along a route
    drafts.py          the drafts of self-speculative decoding (skip set, exit, adapter)
    speculative.py     self-speculative decoding (Draft & Verify; rejection sampling)
    skip_set_search.py the four searches of a draft's skip set, under one budget
    draft_objective.py a skip-set draft's estimated speedup: replayed acceptance, cost model
    modes/             the mode registry: one module per `--mode` (used by generate,
                       the lm-eval model and the benchmarks)
The commands:
    generate.py        `layerdrop generate`
    speedup.py         `layerdrop speculate run`: speculative vs plain decoding, timed
    draft_search.py    `layerdrop speculate search`: the draft's skip set
    threshold_curve.py `layerdrop eval dynamic`: the dynamic-exit threshold curve
"""
