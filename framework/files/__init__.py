"""Files on disk: writing a file under a hidden name and renaming it into place
(``atomic_write.py``), refusing an output path that would overwrite something not asked
for (``output_path.py``), the manifest.json that describes a prepared data folder
(``manifest.py``), and the bounds on nested YAML and JSON a user hands us
(``nesting.py``): the one home of each of those ideas.
"""
