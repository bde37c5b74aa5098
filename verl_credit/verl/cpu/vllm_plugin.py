"""Target of the ``vllm.general_plugins`` entry point (loaded in every vLLM process: API server,
engine core, worker). Does nothing unless ``VERL_PLATFORM=cpu``.

vLLM-CPU's ``UnquantizedLinearMethod.process_weights_after_loading``
(``vllm/model_executor/layers/linear.py:216``) calls ``dispatch_cpu_unquantized_gemm(layer,
remove_weight=True)`` (``vllm/model_executor/layers/utils.py:470-617``): it packs the weight for its
oneDNN kernels and replaces ``layer.weight`` by an empty Parameter without ``weight_loader``. verl's
weight sync then dies in ``model.load_weights()`` (``linear.py:1341``, 'Parameter' object has no
attribute 'weight_loader') and the whole run hangs. For RL the generator must run on the live
weights that the sync overwrites, so linear layers stay on ``F.linear`` over ``layer.weight``.
"""

from __future__ import annotations

from verl_credit.verl.cpu import enabled

__all__ = ["register"]


def register() -> None:
    if not enabled():
        return
    import torch
    import vllm.model_executor.layers.utils as layer_utils

    if getattr(layer_utils, "_verl_credit_live_weights", False):
        return

    def dispatch_cpu_unquantized_gemm(layer: torch.nn.Module, remove_weight: bool) -> None:
        layer.cpu_linear = torch.nn.functional.linear

    layer_utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm
    layer_utils._verl_credit_live_weights = True
