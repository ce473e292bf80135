"""Views of training runs and models: pictures rendered to files (matplotlib's Agg, no
display) and the model card.

    curves.py     training loss, dev loss, dev BLEU and learning rate of one or more runs
    attention.py  the source x target attention of one translated sentence
    card.py       `nmtkit info`: what a model directory is and how it was made
    figure.py     a figure of an exact pixel size, saved atomically

matplotlib is an optional dependency (``pip install nmtkit[plot]``), imported only when a
picture is drawn.
"""
