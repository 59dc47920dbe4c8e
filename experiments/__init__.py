"""The scripts that produce the committed figures and tables, one module each.

Run one from the repository root as ``python -m experiments.NAME`` (the modules import each other as
``experiments.NAME``), and every one that writes a committed output as ``python -m experiments.regenerate``
(``--check`` says which committed outputs the code no longer reproduces).
"""
