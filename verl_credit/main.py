"""``python -m verl_credit.main [hydra overrides]``: verl training with credit estimators.

Thin alias of :mod:`verl_credit.verl.main` (the Hydra entry point).
"""

from verl_credit.verl.main import main

if __name__ == "__main__":
    main()
