"""The evaluation tables of docs/evaluation.md: ``icefrog evaluate TABLE [TABLE ...]``.

Tables: ``main`` (average JCT and ICEFROG's speedup over each baseline at 48 GPUs, 1x/2x/3x
load, 3 seeds), ``size`` (JCT by size class), ``tta`` (time to accuracy per task, ICEFROG vs
Pollux+), ``solver`` (solver time per round per policy and cluster size), ``scale`` (5x/10x/20x
load on 240/480/960 GPUs), ``ablation`` (ICEFROG at 2x load with one thing changed, 3 seeds),
``batch`` (ICEFROG with batch scaling against ICEFROG as is and Pollux+), ``faithful``
(Optimus+/Pollux+ on Pollux's workloads), ``fidelity`` (Pollux+ on V100s against Pollux's
published per-job JCTs); ``all`` is every one. ``size``, ``tta`` and
``solver`` read the runs of ``main`` (and ``solver`` those of ``scale``).

- :mod:`.runs`: one simulation (``Run``), one sampled Philly workload (``Trace``) and the
  resumable ``Runner`` that spawns ``icefrog simulate`` processes;
- :mod:`.grid`: the experiment sizes (``Grid``) and the runs each table needs;
- :mod:`.tables`: the tables themselves, from the runs' ``summary.json``;
- :mod:`.driver`: a table end to end (run what is missing, print, save).

Nothing here is imported by the rest of the package but ``icefrog_slurm.commands.evaluate``.
"""
