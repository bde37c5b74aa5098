"""verl 0.9.1 integration: the only package of verl-credit that imports verl.

Modules: ``plugin`` (entry-point target: registrations), ``trainer`` (``credit_sync``),
``agent_loop`` (``credit_agent``), ``users`` (simulated users), ``annotation`` (async annotation),
``batch`` (rows -> sessions -> spans), ``settings`` (the ``credit`` Hydra node), ``estimators``
(legacy-registry guards), ``main`` (Hydra entry point, ``python -m verl_credit.main``),
``policy_loss`` (verl's clipped loss for the token-policy benchmark).
"""
