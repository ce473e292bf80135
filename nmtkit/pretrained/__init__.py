"""Models trained elsewhere: MarianMT (Hugging Face, OPUS-MT) in (`nmtkit import`) and out
(`nmtkit export --format marian`)."""
