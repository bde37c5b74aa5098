"""The ``verl-credit`` command line: argument parsing only; every command calls library code."""
