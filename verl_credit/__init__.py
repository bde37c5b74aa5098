"""verl-credit: dependency-aware credit assignment (IAPO, CALL-CREDIT) for multi-turn GRPO in verl.

The library is importable without verl; only ``verl_credit.verl`` imports verl.
"""

__version__ = "0.1.0"
