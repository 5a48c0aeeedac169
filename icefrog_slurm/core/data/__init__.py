"""Package data of the core: the shipped layer tables (see ``transformer_tables``)."""
