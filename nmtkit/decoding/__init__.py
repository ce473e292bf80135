"""Decoding: search over the model contract and the translation front end.

    search.py        beam_search, greedy_search, sample; target prefixes
    hypothesis.py    Hypothesis, length penalty, one sentence's length limit (no torch: CTranslate2 runs without it)
    constraints.py   LexicalConstraints: constrained beam search (dynamic beam allocation)
    guides.py        Guide (a line's prefix and constraints), their files, pieces and output text
    ensemble.py      EnsembleModel: several models behind the same contract
    batching.py      length-sorted, token-budgeted inference batches
    torch_engine.py  TorchEngine: loaded models on a device and dtype, searched with search.py
    options.py       TranslateOptions: DecodeConfig plus per-call settings (no torch)
    translate.py     Translator(engine, options), translate_lines (lines in, lines out);
                     Translator.hypotheses for callers that format their own output (the server)
    parallel.py      run_side_by_side: search batches at once on a CPU, the threads shared (--workers)
    alignment.py     attention to Pharaoh i-j pairs over pieces or whitespace words
"""
