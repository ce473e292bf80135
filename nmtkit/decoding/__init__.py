"""Decoding: search over the model contract and the translation front end.

    search.py     beam_search, greedy_search, sample; Hypothesis; length penalty
    ensemble.py   EnsembleModel: several models behind the same contract
    batching.py   length-sorted, token-budgeted inference batches
    translate.py  TranslateOptions, translate_lines, translate_file (lines in, lines out)
"""
