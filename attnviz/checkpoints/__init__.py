"""Checkpoint intake and safety: everything attnviz checks in a model folder before transformers reads a byte.

- ``uploads``: what a person uploads or types, turned into a model folder on disk, refusing anything unsafe
- ``preflight``: every check of a folder, in order; ``safety``: the refusal they raise and the limits they share
- ``checked_files``, ``weight_files``, ``tokenizer_files``: the folder's files, its weights and its tokenizer's files
- ``config_numbers``: a config's numbers, checked on its JSON; ``image_processors``: a vision checkpoint's processor
- ``disk``: the disk uploads take, all browsers together; ``keep``: models a browser added, kept for its next visit
"""
