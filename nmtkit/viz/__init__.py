"""Pictures of training runs and models, rendered to files (matplotlib's Agg, no display).

    curves.py     training loss, dev loss, dev BLEU and learning rate of one or more runs
    spread.py     a replicated sweep: each variant's mean and standard deviation over seeds and splits
    attention.py  the source x target attention of one translated sentence
    figure.py     a figure of an exact pixel size, saved atomically

matplotlib is an optional dependency (``pip install nmtkit[plot]``), imported only when a
picture is drawn. The text model card of ``nmtkit info`` is ``nmtkit/card.py``.
"""
