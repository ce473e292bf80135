"""The fixed special token ids every SentencePiece model and every architecture share.

One home, below data and models, so that neither has to import the other for them.
"""

PAD, UNK, BOS, EOS = 0, 1, 2, 3

# SentencePiece trainer arguments that pin the ids above
SPM_SPECIAL_IDS = dict(pad_id=PAD, unk_id=UNK, bos_id=BOS, eos_id=EOS)
