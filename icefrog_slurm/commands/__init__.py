"""One module per ``icefrog`` subcommand: ``add_arguments(parser)`` and ``run(args) -> int``."""
