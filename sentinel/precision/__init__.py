"""Rule precision: a labelled corpus of event streams replayed through the real rules."""
