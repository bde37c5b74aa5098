#!/usr/bin/env python
"""Does routed credit make verl's real GRPO trainer learn faster? (verl_credit/bench/cpu_learning_main.py)

python scripts/bench_cpu_learning.py            # the sweep, then the measured runs: hours on 2 cores, resumable
python scripts/bench_cpu_learning.py --quick    # 2 arms x 1 seed x 2 steps (the CI check)
python scripts/bench_cpu_learning.py --summarize-only   # the table and picture of the runs finished so far
python scripts/bench_cpu_learning.py --summarize-only --rediagnose  # ... diagnostics recomputed from the dumps
"""

import sys

from verl_credit.bench.cpu_learning_main import main

if __name__ == "__main__":
    sys.exit(main())
