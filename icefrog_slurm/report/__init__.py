"""sacct/squeue-style views over the state store (``icefrog squeue``, ``sacct``, ``show job``).

``queries.py`` reads (one read-only transaction a report, through ``store.views``);
everything else is pure: ``jobs.py`` computes a job's figures (GPU-hours, restarts,
reallocations, TTA), ``select.py`` parses and applies the job filters, ``timefmt.py``
formats and parses times like Slurm, ``table.py`` renders field lists like sacct, and
``squeue.py``, ``sacct.py``, ``show.py`` define each report's fields and JSON.
"""
