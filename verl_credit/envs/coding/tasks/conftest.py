"""Keep pytest away from the shipped task repositories (their bugs are on purpose)."""

collect_ignore_glob = ["*"]
