"""The pieces of ``benchmarks/report.py``, one concern each.

``results`` finds the results files, ``text`` formats numbers and environments, ``plots``
draws the figures (matplotlib, optional), ``posix``, ``s3``, ``slurm`` and ``lua`` render
one benchmark's section each, ``generic`` any other results file, and ``document`` puts
the sections together, keeping the hand-written notes of the current document.
"""
