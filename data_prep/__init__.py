"""Corpora -> tokenizer -> litdata token chunks (+ manifest.json): `layerdrop prepare`."""
