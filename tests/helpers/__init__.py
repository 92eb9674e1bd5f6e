"""Helpers shared by the test suite, imported as ``from tests.helpers.tiny_training import
...``: tiny models, data and training runs, a pretrained run to load, the refusal and
reliability-battery checks of a command run as a subprocess, a tiny Hugging Face Llama,
a hand-written reference decoder, and a callback that records every optimizer step.
"""
