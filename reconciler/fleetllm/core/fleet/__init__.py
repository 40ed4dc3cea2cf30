"""The fleet repository: strict loading, validation, the typed model and box JSON rendering.

Everything in this package is pure (no network, no git, no clock) except `source`, the adapter that
reads the repository's files from a directory or a git commit.
"""
