"""Loading and unloading LoRA adapters while the server runs, with vLLM's API (`serve --allow-adapter-updates`).

    POST /v1/load_lora_adapter    {"lora_name": "sql", "lora_path": "adapters/sql"}   (+ "load_inplace": true)
    POST /v1/unload_lora_adapter  {"lora_name": "sql"}

Both answer 200 with vLLM's plain-text line ("Success: LoRA adapter 'sql' added successfully." /
"... removed successfully."), after which /v1/models lists (or no longer lists) the adapter and
requests with `"model": "sql"` use it (or get 404 model_not_found). Errors are the server's JSON error
object: 400 naming the field (a missing or empty field, a path that is not an adapter or does not fit
the base model, the base model's name, a name already loaded without `load_inplace`), 404 unloading a
name that is not loaded (vLLM's), 409 adapter_in_use when a request that is submitted, waiting or running
uses it (vLLM unloads regardless; here the adapter's rows would change under them), 503 while shutting
down. `load_inplace: true` replaces a loaded adapter of that name (also refused while in use), as vLLM's
does. Unload's `lora_int_id` is accepted and unused (adapters are named), as in vLLM.

Off by default, as vLLM keeps it behind VLLM_ALLOW_RUNTIME_LORA_UPDATING: with it on, a client can make
the server open any directory it can read (only safetensors and JSON are read, nothing is executed, and a
relative lora_path is taken from the server's working directory), so use it with --api-key, which the
routes require like every other. Off, both routes answer 404 saying how to turn them on.

One update at a time: the files are read and checked in a worker thread while the engine goes on
(AdapterBank.prepare), and the bank is changed between two engine steps (Scheduler.between_steps),
where the in-use check also runs, so no step sees a half-changed bank and no request can start using an
adapter between the check and its removal. A load reuses a freed index under a new prefix-cache key
(blocks cached for the index's previous adapter are never hit). With --compile, the decode step compiles
again at the first step after each change (the adapters' stacks are new tensors, of new shapes), and once
torch's recompile limit (torch._dynamo.config.recompile_limit, 8) is reached it runs eagerly: correct, slower.
"""

from __future__ import annotations

import logging
import threading

from pydantic import Field

from groundup.errors import GroundupError
from groundup.serve.protocol import APIError, _Strict
from groundup.serve.scheduler import Busy

log = logging.getLogger("groundup.serve")

HOW_TO_ENABLE = ("loading and unloading adapters at run time is off; start the server with --allow-adapter-updates "
                 "(a client can then make it read any adapter directory it can reach: set --api-key too)")


class LoadLoRAAdapterRequest(_Strict):
    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)
    load_inplace: bool = False  # vLLM's: replace the adapter loaded under lora_name


class UnloadLoRAAdapterRequest(_Strict):
    lora_name: str = Field(min_length=1)
    lora_int_id: int | None = None  # vLLM's; unused: adapters are named


class AdapterUpdates:
    """The server's adapter loads and unloads; `load` and `unload` block, so the app runs them in a
    worker thread."""

    def __init__(self, server):
        self.server = server
        self.lock = threading.Lock()  # one update at a time: a prepare never overlaps a change of the bank

    def load(self, req: LoadLoRAAdapterRequest) -> str:
        server, bank, name = self.server, self.server.bank, req.lora_name
        with self.lock:
            if name == server.name:
                raise APIError(400, f"lora_name: {name!r} is the base model's name; pick another", param="lora_name",
                               code="invalid_value")
            if bank.find(name) is not None and not req.load_inplace:
                raise APIError(400, f"The lora adapter '{name}' has already been loaded; unload it first, or pass "
                                    "\"load_inplace\": true to replace it", param="lora_name", code="adapter_exists")
            try:
                prepared = bank.prepare(req.lora_path)
            except (GroundupError, OSError, ValueError, RuntimeError) as e:
                raise APIError(400, f"lora_path: {e}", param="lora_path", code="invalid_adapter") from None

            def swap() -> int:  # between steps
                if bank.find(name) is not None:  # load_inplace
                    self._check_unused(name)
                    bank.remove(name)
                return bank.install(name, prepared)

            index = self._between_steps(swap)
        log.info("loaded LoRA adapter %r from %s (index %d)", name, prepared.dir, index)
        return f"Success: LoRA adapter '{name}' added successfully."

    def unload(self, req: UnloadLoRAAdapterRequest) -> str:
        server, bank, name = self.server, self.server.bank, req.lora_name
        with self.lock:
            if name == server.name:
                raise APIError(400, f"lora_name: {name!r} is the base model, which cannot be unloaded",
                               param="lora_name", code="invalid_value")

            def drop() -> None:  # between steps
                if bank.find(name) is None:
                    loaded = ", ".join(bank.names) or "none"
                    raise APIError(404, f"The lora adapter '{name}' cannot be found (loaded: {loaded})",
                                   param="lora_name", code="model_not_found")
                self._check_unused(name)
                bank.remove(name)

            self._between_steps(drop)
        log.info("unloaded LoRA adapter %r", name)
        return f"Success: LoRA adapter '{name}' removed successfully."

    def _check_unused(self, name: str) -> None:
        users = self.server.scheduler.users(self.server.bank.index(name))
        if users:
            raise APIError(409, f"The lora adapter '{name}' is in use by {users} request{'s' if users > 1 else ''} "
                                "(submitted, waiting or running); retry once they have finished",
                           param="lora_name", code="adapter_in_use")

    def _between_steps(self, fn):
        try:
            return self.server.scheduler.between_steps(fn).result()
        except Busy as e:
            raise APIError(503, f"the server is busy: {e}", type="server_error", code="server_busy") from None
