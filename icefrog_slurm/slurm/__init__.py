"""The cluster port and its adapters: pure command builders and parsers, the CLI backend."""
