"""The pieces of ``benchmarks/report.py``, one concern each.

``results`` finds the results files, ``text`` formats numbers and the machine they ran on,
``plots`` draws the figures (matplotlib, optional), ``staging`` (POSIX, S3), ``job_array``
and ``hooks`` (hook round trip, directive parsing), ``worker_bounds`` (latency during a copy
burst, with and without the workers' cgroup) render one benchmark's section each,
``generic`` any other results file, and ``document`` puts the sections together, keeping
the hand-written notes of the current document.
"""
