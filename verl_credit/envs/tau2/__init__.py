"""tau2-bench (airline, retail, telecom) for the credit agent loop; needs ``pip install 'verl-credit[tau2]'``.

Importing this package registers the environment name ``"tau2"`` without importing tau2 itself;
building one (``build_environment("tau2", user={...})``) imports tau2 and names the install command
if it is missing.
"""

from verl_credit.envs.tau2.env import Tau2Environment
from verl_credit.envs.tau2.user_sim import UserSimConfig, UserSimulatorError

__all__ = ["Tau2Environment", "UserSimConfig", "UserSimulatorError"]
