"""icefrog-slurm: the ICEFROG scheduler (layer freezing as a scheduling variable) on Slurm.

The scheduler side lives here and never imports torch; the job side is ``launcher/``.
"""

__version__ = "0.1.0"
