"""Benchmarks for inferq: ``python -m benchmarks <scenario>``.

Each scenario measures ratios side by side in one run (the machines are noisy), writes its raw
figures to ``benchmarks/out/<scenario>.json`` and its table, command, machine and date to its
own section of ``benchmarks/RESULTS.md``.
"""
