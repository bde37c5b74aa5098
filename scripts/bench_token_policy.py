#!/usr/bin/env python
"""Token-level learning benchmark (see verl_credit/bench/token_policy.py).

python scripts/bench_token_policy.py --workers 2    # full run: 10 seeds x 5 arms x 2 variants, 768 rollouts
python scripts/bench_token_policy.py --quick       # smoke test
"""

import sys

from verl_credit.bench.token_policy_main import main

if __name__ == "__main__":
    sys.exit(main())
