#!/usr/bin/env python
"""Learning benchmark (see verl_credit/bench/learning.py); same flags as `verl-credit bench learning`.

python scripts/bench_learning.py                 # full run: 20 seeds x 4 arms x 3 variants
python scripts/bench_learning.py --quick         # smoke test
"""

import sys

from verl_credit.bench.learning_main import main

if __name__ == "__main__":
    sys.exit(main())
