"""CTranslate2: everything nmtkit does with it, in one place.

    export.py   `nmtkit export --format ctranslate2`: our Transformer weights into its spec
    engine.py   `nmtkit translate --engine ctranslate2`: the search of an exported model
"""
