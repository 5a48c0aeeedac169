"""The pure core of ICEFROG: numbers in, decisions out.

No SQL, no subprocess, no clock, no environment variables, no torch (enforced by
import-linter). Every formula carries its spec equation number (式 N of
``shared/spec``) in the docstring of the function that computes it.
"""
