"""Hugging Face folders: reading and writing one (``folder.py``), the special tokens it
carries into exports (``tokens.py``), and the self-speculative draft an export writes for
transformers' ``generate`` (``draft.py``)."""
