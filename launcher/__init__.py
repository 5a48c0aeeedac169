"""The job side: the torchrun wrapper and the PyTorch Model Trainer (the only code that imports
torch). It imports only the protocol types of icefrog_slurm, never its controller."""
