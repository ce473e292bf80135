"""The fixed special token ids every SentencePiece model and every architecture share.

One home, below data and models, so that neither has to import the other for them.
"""

PAD, UNK, BOS, EOS = 0, 1, 2, 3

# SentencePiece trainer arguments that pin the ids above
SPM_SPECIAL_IDS = dict(pad_id=PAD, unk_id=UNK, bos_id=BOS, eos_id=EOS)


def cut_source(ids, limit: int):
    """The first ``limit`` ids of a source (a list, or an array: kept one); one that ends in EOS (an
    imported MarianMT model's sources do) keeps it last, as MarianTokenizer's truncation does. No
    imports: translating an export must not load torch."""
    if len(ids) <= limit:
        return ids
    if ids[-1] != EOS:
        return ids[:limit]
    if isinstance(ids, list):
        return ids[:limit - 1] + ids[-1:]
    return ids[[*range(limit - 1), len(ids) - 1]]  # an array, by its own indexing
