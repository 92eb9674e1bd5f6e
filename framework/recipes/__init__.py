"""Recipes as code: ``layerdrop recipe`` derives one from a model size, a token budget and
the devices by Table A.2's transfer rules (``recipe.py``), checks which dotted keys a
recipe may set (``recipe_keys.py``), estimates whether it fits in device memory
(``device_memory.py``) and writes it as YAML with a comment per key
(``commented_yaml.py``). The recipe files themselves live in the top-level recipes/.
"""
