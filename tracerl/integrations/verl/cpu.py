"""verl 0.9.1 on the CPU: everything that adapts verl to a machine without an accelerator.

Load it before verl resolves its platform, through verl's own hook for external modules::

    VERL_PLATFORM=cpu VERL_USE_EXTERNAL_MODULES=tracerl.integrations.verl.cpu python -m verl.trainer.main_ppo ...

``import verl`` imports the modules ``VERL_USE_EXTERNAL_MODULES`` names before its plug-in entry
points (``verl/__init__.py``) and raises their import errors, where an entry point's would be
logged at DEBUG level; and verl fixes its platform while tracerl's plug-in loads
(``verl/workers/engine/fsdp/transformer_impl.py`` calls ``get_device_name()`` at import), so the
platform has to be registered first. With ``VERL_PLATFORM`` unset this module only registers the
platform (never picked by auto-detection) and changes nothing.

What it touches, by verl function (the pinned version is checked: :data:`PINNED`):

* ``verl.plugin.platform.platform_manager.PlatformRegistry.register``: :class:`PlatformCPU`, a
  platform named ``cpu``: gloo, ``current_device() == "cpu"`` (verl moves tensors to
  ``get_device_id()``; 0 would mean ``cuda:0``) and a device module with the ``torch.cuda`` calls
  verl makes unconditionally (``empty_cache``, ``mem_get_info``, ``memory_allocated``, rng state).
  Its Ray resource is ``GPU``: ``ResourcePoolManager._check_resource_available``
  (``verl/single_controller/ray/base.py``) counts only GPUs, so a CPU run gives Ray one logical GPU
  (``+ray_kwargs.ray_init.num_gpus=1``; CPU-only torch never touches it).
* ``verl.utils.distributed.initialize_global_process_group_ray`` asks torch for the backend
  ``"cpu:gloo,{device}:{backend}"``, i.e. ``"cpu:gloo,cpu:gloo"``, which
  ``torch.distributed.init_process_group`` rejects ("Duplicate device type cpu"): the call is
  wrapped to drop the repeat (:func:`_one_backend_per_device`).
* ``verl.workers.engine.base.EngineRegistry.register``: verl's FSDP engine
  (``FSDPEngineWithLMHead``) registered for the device ``cpu`` (verl registers it for cuda and npu).
* ``verl.workers.engine.fsdp.transformer_impl.CPUOffloadPolicy``: forward-only engines (the
  reference) always offload with ``pin_memory=True``, which needs an accelerator; replaced by a
  subclass that never pins.

The rollout servers on the CPU are tracerl's HF servers (:mod:`.hf_rollout`, registered by the
plug-in as ``actor_rollout_ref.rollout.name=tracerl_hf``). Settings the run needs besides these:
``trainer.device=cpu``, ``trainer.n_gpus_per_node=1``, eager attention, ``use_remove_padding=False``,
``strategy=fsdp2``, tensor parallel 1 and float32 mixed precision (``examples/verl/cpu/``).
"""

from __future__ import annotations

import os
import types
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
import verl
from verl.plugin.platform import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

from tracerl.errors import UserError

PINNED = "0.9.1"
"""The verl version every adaptation here was read against."""
ACTIVE = os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu"
"""Whether this process runs verl on the CPU (``VERL_PLATFORM=cpu``)."""


def check_version(found: str = verl.__version__) -> None:
    """Refuse (one line) a verl other than :data:`PINNED`: the patches name its internals."""
    if found != PINNED:
        raise UserError(f"tracerl.integrations.verl.cpu adapts verl {PINNED}, found verl {found}; "
                        f"install the pinned one (pip install -e '.[verl]')")


def _zero(*_: Any, **__: Any) -> int:
    return 0


def _nothing(*_: Any, **__: Any) -> None:
    return None


def _free_memory(*_: Any, **__: Any) -> tuple[int, int]:
    return (1 << 40, 1 << 40)


def _device_module() -> types.ModuleType:
    """``torch.cpu`` plus the ``torch.cuda`` calls verl makes through ``get_torch_device()`` (memory
    counters read 0, caches and streams do nothing, rng state is torch's)."""
    module = types.ModuleType("tracerl_verl_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("__"):
            setattr(module, name, getattr(torch.cpu, name))
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
        setattr(module, name, _zero)
    for name in ("set_device", "synchronize", "empty_cache", "ipc_collect", "set_per_process_memory_fraction",
                 "reset_peak_memory_stats", "reset_accumulated_memory_stats"):
        setattr(module, name, _nothing)
    module.mem_get_info = _free_memory  # type: ignore[attr-defined]
    module.is_available = lambda: True  # type: ignore[attr-defined]
    module.device_count = lambda: 1  # type: ignore[attr-defined]
    module.current_device = lambda: "cpu"  # type: ignore[attr-defined]
    module.get_device_name = lambda *_, **__: "cpu"  # type: ignore[attr-defined]
    module.get_rng_state = lambda *_, **__: torch.get_rng_state()  # type: ignore[attr-defined]
    module.set_rng_state = lambda state, *_, **__: torch.set_rng_state(state)  # type: ignore[attr-defined]
    module.manual_seed = torch.manual_seed  # type: ignore[attr-defined]
    module.manual_seed_all = torch.manual_seed  # type: ignore[attr-defined]
    module.stream = lambda *_, **__: nullcontext()  # type: ignore[attr-defined]
    return module


DEVICE_MODULE = _device_module()


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """verl's platform interface (``verl/plugin/platform/platform_base.py``) on the CPU."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> Any:
        return DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return ACTIVE  # chosen by VERL_PLATFORM=cpu only, never by auto-detection

    def current_device(self) -> Any:
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: Any) -> None:
        return None

    def synchronize(self, device_index: Any = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"  # verl's resource pools count GPUs only (module docstring)

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> None:
        return None


_INIT_PROCESS_GROUP = dist.init_process_group


def _one_backend_per_device(*args: Any, backend: str | None = None, **kwargs: Any) -> Any:
    """``torch.distributed.init_process_group`` with a ``"dev:backend,..."`` list cut to one entry a
    device type (verl asks for ``"cpu:gloo,cpu:gloo"`` on the CPU)."""
    if isinstance(backend, str) and "," in backend:
        backend = ",".join(dict.fromkeys(part.strip() for part in backend.split(",")))
    return _INIT_PROCESS_GROUP(*args, backend=backend, **kwargs)


def _engine_and_offload() -> None:
    """verl's FSDP engine for the ``cpu`` device, and an offload policy that never pins memory."""
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl

    engines = EngineRegistry._engines.get("language_model", {})
    if "cpu" not in engines.get("fsdp2", {}):
        EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"],
                                device="cpu")(transformer_impl.FSDPEngineWithLMHead)

    class UnpinnedOffload(transformer_impl.CPUOffloadPolicy):  # type: ignore[name-defined,misc]
        """``CPUOffloadPolicy`` whose host copies are not pinned (pinning needs an accelerator)."""

        def __init__(self, pin_memory: bool = True) -> None:
            super().__init__(pin_memory=False)

    if not getattr(transformer_impl.CPUOffloadPolicy, "_tracerl_unpinned", False):
        UnpinnedOffload._tracerl_unpinned = True  # type: ignore[attr-defined]
        transformer_impl.CPUOffloadPolicy = UnpinnedOffload


if ACTIVE:
    check_version()
    dist.init_process_group = _one_backend_per_device
    _engine_and_offload()
