"""The models a server serves, by name: one model directory (`--model DIR`), or a repository
of them (`--model-repository DIR`: DIR/<name>/<version>/, Triton's layout, versions positive
integers; the newest version of each model is served, Triton's "latest" policy).

Loading runs beside serving. A reload builds and warms the new version beside the old one,
then switches in one step; a request is looked up and admitted without an await between the
two, so each request is admitted by exactly one version, and the old version's admitted
requests finish on it before it is freed. A failed load leaves what was serving serving,
and says why. Every call that names a model, on any transport, finds it inside `observed`,
which also counts and times the call by model and version; calls about the server alone
(liveness, readiness, its metadata, the index, loads, shared memory) are not counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from attnserve.service.core.dataplane import DataPlane
from attnserve.service.core.errors import (
    AttnserveError,
    InvalidInputError,
    ModelLoadError,
    ModelNotFoundError,
)
from attnserve.service.core.memory import give_back_memory
from attnserve.service.core.metrics import Metrics
from attnserve.service.core.status import code_name

log = logging.getLogger(__name__)

READY, UNAVAILABLE, LOADING, UNLOADING = "READY", "UNAVAILABLE", "LOADING", "UNLOADING"
# Builds one model version (name, version, directory) with its backend and batcher, not yet
# started; the name is None for --model, where the model's own config names it.
Loader = Callable[[str | None, str, Path], Awaitable[DataPlane]]


@dataclass
class ModelState:
    """A model of the repository as the index reports it."""

    name: str
    version: str
    state: str  # READY, UNAVAILABLE, LOADING or UNLOADING
    reason: str = ""


def versions(folder: Path) -> dict[int, Path]:
    """The version folders of one model: positive integers, as Triton names them."""
    found = {}
    for child in folder.iterdir() if folder.is_dir() else ():
        if child.is_dir() and child.name.isdigit() and int(child.name) > 0:
            found[int(child.name)] = child
    return found


class ModelRepository:
    def __init__(
        self,
        load: Loader,
        metrics: Metrics,
        root: Path | None = None,
        single: Path | None = None,
        default: str | None = None,
        grace_seconds: float = 30.0,
    ) -> None:
        if (root is None) == (single is None):
            raise ValueError("give a repository root or a single model directory")
        self._load = load
        self.metrics = metrics
        self.root = root
        self.single = single
        self.default = default
        self.grace_seconds = grace_seconds
        self.served: dict[str, DataPlane] = {}  # what requests reach, by name
        self._states: dict[str, ModelState] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._draining = False

    # ---------------------------------------------------------------- lookup

    def get(self, name: str = "", version: str = "") -> DataPlane:
        """The data plane serving `name` ("": the default model) at `version` ("": the one
        served)."""
        if not name:
            name = self._default_name()
        dataplane = self.served.get(name)
        if dataplane is None:
            known = ", ".join(sorted(self.served)) or "none"
            state = self._states.get(name)
            why = f" ({state.state.lower()}: {state.reason})" if state and state.reason else ""
            raise ModelNotFoundError(f"model: no model {name!r}{why}; served: {known}")
        if not dataplane.matches(version):
            raise ModelNotFoundError(
                f"model_version: {name!r} has no version {version!r} served; "
                f"version {dataplane.version!r} is"
            )
        return dataplane

    def _default_name(self) -> str:
        if self.default:
            return self.default
        if len(self.served) == 1:
            return next(iter(self.served))
        raise InvalidInputError(
            "model: this server serves several models ("
            + ", ".join(sorted(self.served))
            + "); name one, or start it with --default-model"
        )

    @contextlib.contextmanager
    def observed(self, method: str) -> Iterator[Callable[..., DataPlane]]:
        """Count and time one call of `method` by its outcome; yields `find(name="",
        version="")`, `get` that also labels the call with the model it found (model ""
        where none was: names from clients never become labels). Find the model right before
        awaiting its data plane, so that no reload slips in between. What was raised goes on
        to the transport's error wrapper, which logs it if unexpected and maps it."""
        start = time.perf_counter()
        labels = ["", ""]
        error: BaseException | None = None

        def find(name: str = "", version: str = "") -> DataPlane:
            dataplane = self.get(name, version)
            labels[:] = [dataplane.name, dataplane.version]
            return dataplane

        try:
            yield find
        except Exception as exc:
            error = exc
            raise
        finally:
            self.metrics.requests.labels(method, code_name(error), *labels).inc()
            latency = time.perf_counter() - start
            self.metrics.request_latency.labels(method, *labels).observe(latency)

    def index(self, ready_only: bool = False) -> list[ModelState]:
        """Every model of the repository, loaded or not (Triton's index)."""
        states = dict(self._states)
        if self.root is not None:
            for folder in sorted(self.root.iterdir()):
                found = versions(folder)
                if found and folder.name not in states:
                    states[folder.name] = ModelState(folder.name, str(max(found)), UNAVAILABLE)
        listed = sorted(states.values(), key=lambda s: s.name)
        return [s for s in listed if s.state == READY or not ready_only]

    @property
    def ready(self) -> bool:
        return self.unready_reason is None

    @property
    def unready_reason(self) -> str | None:
        """Why requests would be refused now ("no model", or each refusing model's reason:
        loading, warming up, draining), or None when every served model is ready."""
        if not self.served:
            return "no model"
        refusals = [f"{name}: {d.refusal}" for name, d in self.served.items() if d.refusal]
        return "; ".join(refusals) or None

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Build every model (not yet warm). A model that fails to build is left out, its
        reason in the index; a server with no model at all does not start."""
        if self.root is not None and not self.root.is_dir():
            raise ModelLoadError(f"--model-repository {self.root}: not a directory")
        names: list[str | None] = [None] if self.root is None else list(self._names())
        if not names:
            raise ModelLoadError(
                f"--model-repository {self.root}: no model in it (a model is a folder "
                "<name>/<version>/ holding what `attnserve export` writes)"
            )
        for name in names:
            try:
                await self._build(name)
            except AttnserveError as exc:
                if self.root is None:
                    raise
                log.error("model %s not loaded: %s", name, exc)
        if not self.served:
            raise ModelLoadError(f"no model in {self.root} could be loaded (see the log)")
        if self.default and self.default not in self.served:
            raise ModelLoadError(
                f"--default-model {self.default}: no such model served; served: "
                + ", ".join(sorted(self.served))
            )

    async def warm_up(self) -> None:
        """Start and warm every built model, then let requests in."""
        for dataplane in list(self.served.values()):
            await dataplane.start()

    async def load(self, name: str) -> None:
        """Load a model, or reload it: the newest version on disk, built and warmed beside
        the one serving, then switched to; the old one drains and is freed."""
        self._check_repository("load", name)
        async with self._lock(name):
            self._check_name(name)
            old = self.served.get(name)
            self._states[name] = ModelState(name, old.version if old else "", LOADING)
            new: DataPlane | None = None
            try:
                new = await self._build(name, serve=False)
                await new.start()
            except BaseException as exc:
                if new is not None:  # built, but it did not come up: free it
                    await new.stop()
                    if old is None or old.version != new.version:
                        self.metrics.forget(new.name, new.version)
                if old is not None:
                    self._states[name] = ModelState(
                        name, old.version, READY, f"reload failed: {exc}"
                    )
                else:
                    self._states[name] = ModelState(name, "", UNAVAILABLE, str(exc))
                raise
            if self._draining:
                new.start_draining()
            self.served[name] = new  # the switch: from here on, requests reach `new`
            self._states[name] = ModelState(name, new.version, READY)
            if old is not None:
                await self._retire(old, forget=old.version != new.version)

    async def unload(self, name: str) -> None:
        """Stop serving a model: no new requests, the admitted ones finish, then it is freed."""
        self._check_repository("unload", name)
        async with self._lock(name):
            old = self.served.pop(name, None)
            if old is None:
                raise ModelNotFoundError(f"model: {name!r} is not loaded")
            self._states[name] = ModelState(name, old.version, UNLOADING)
            await self._retire(old, forget=True)
            self._states[name] = ModelState(name, old.version, UNAVAILABLE, "unloaded")

    def start_draining(self) -> None:
        """The server is stopping: every model refuses new work."""
        self._draining = True
        for dataplane in self.served.values():
            dataplane.start_draining()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no model has a request in flight; False if `timeout` ran out first."""
        deadline = time.monotonic() + timeout
        for dataplane in list(self.served.values()):
            if not await dataplane.wait_idle(max(0.0, deadline - time.monotonic())):
                return False
        return True

    async def wait_quiet(self, quiet: float, timeout: float) -> bool:
        """Wait until no request has come to any model for `quiet` seconds, so clients have
        moved to other replicas (those that watch the health service do at once) and the
        calls already on their way have come and been refused; False if `timeout` ran out
        first."""
        deadline = time.monotonic() + timeout
        while True:
            last = max((d.last_call for d in self.served.values()), default=0.0)
            now = time.monotonic()
            if now >= last + quiet:
                return True
            if now >= deadline:
                return False
            await asyncio.sleep(min(last + quiet, deadline) - now)

    async def stop_generating(self) -> None:
        for dataplane in list(self.served.values()):
            await dataplane.stop_generating()

    async def stop(self) -> None:
        for dataplane in list(self.served.values()):
            await dataplane.stop()

    # ---------------------------------------------------------------- inside

    def _names(self) -> list[str]:
        assert self.root is not None
        return [f.name for f in sorted(self.root.iterdir()) if versions(f)]

    def _check_repository(self, action: str, name: str) -> None:
        if self.root is None:
            raise InvalidInputError(
                f"model: cannot {action} {name!r}: a server of one model directory (--model "
                f"{self.single}) does not {action} models; serve a repository "
                "(--model-repository DIR) for that. SAEs "
                "added to its directory (attnserve sae add) are served within seconds, "
                "without a reload"
            )

    def _check_name(self, name: str) -> None:
        assert self.root is not None  # _check_repository first
        if "/" in name or name.startswith(".") or not versions(self.root / name):
            raise ModelNotFoundError(
                f"model: no model {name!r} in the repository {self.root} "
                "(a folder <name>/<version>/ holding an exported model)"
            )

    async def _build(self, name: str | None, serve: bool = True) -> DataPlane:
        """Build the newest version of `name` (None: the single model directory)."""
        if name is None:
            assert self.single is not None
            version, directory = "1", self.single
        else:
            assert self.root is not None
            found = versions(self.root / name)
            if not found:
                raise ModelLoadError(f"{self.root / name}: no version folder (1/, 2/, ...)")
            newest = max(found)
            version, directory = str(newest), found[newest]
        log.info("loading %s version %s from %s", name or "the model", version, directory)
        dataplane = await self._load(name, version, directory)
        if serve:
            self.served[dataplane.name] = dataplane
            self._states[dataplane.name] = ModelState(dataplane.name, version, READY)
        return dataplane

    async def _retire(self, old: DataPlane, forget: bool) -> None:
        """Drain and free a version nobody can reach any more; `forget` its series unless
        the version that replaced it has the same labels."""
        old.start_draining()
        if not await old.wait_idle(self.grace_seconds):
            log.warning(
                "%s version %s: requests still in flight after the grace period",
                old.name,
                old.version,
            )
        await old.stop()
        if forget:
            self.metrics.forget(old.name, old.version)
        log.info("%s version %s freed", old.name, old.version)
        if old.release_memory:  # its sessions' heap, once the caller has let go of it too,
            loop = asyncio.get_running_loop()  # and off the loop: the other models serve on
            loop.call_soon(loop.run_in_executor, None, give_back_memory)

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())
