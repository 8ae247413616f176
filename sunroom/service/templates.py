"""The service's kernel templates: started on first use, shared by raw kernels and sessions.

``ServiceConfig.templates`` names them (name → setup code). A request names one with
``"template"``; :meth:`Templates.get` starts it on first use (a failing setup answers that
request with the setup's error, and the next request tries again). Every template runs on this
server's backend with the default limits; its kernels' host functions are installed on top
(sessions' ledger-wrapped ones included), so a template itself has none.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import final

from sunroom.errors import UsageError
from sunroom.sandbox.template import Template
from sunroom.service.config import ServiceConfig
from sunroom.service.probes import NO_PROBE, Probe

__all__ = ["Templates"]

log = logging.getLogger("sunroom.service")


@final
class Templates:
    """The templates of one server, by name.

    Each :meth:`get` is reported to *probe* as a claim from pool ``template:NAME``: a hit when
    the template was started already, a miss when this call started it.
    """

    def __init__(self, config: ServiceConfig, *, probe: Probe = NO_PROBE) -> None:
        self._probe = probe
        self._setups = dict(config.templates)
        self._config = config
        self._live: dict[str, Template] = {}
        self._lock = asyncio.Lock()

    def check(self, name: str | None) -> None:
        """Raise UsageError unless *name* is None or a configured template."""
        if name is not None and name not in self._setups:
            known = ", ".join(sorted(self._setups)) or "none"
            raise UsageError(f"unknown template {name!r}; this server has: {known}")

    async def get(self, name: str) -> Template:
        """The started template *name*. Raises UsageError (unknown), KernelStartError (setup)."""
        self.check(name)
        began = time.monotonic()
        async with self._lock:
            template = self._live.get(name)
            hit = template is not None
            if template is None:
                backend = self._config.kernel_backend()
                template = Template(setup=self._setups[name], backend=backend)
                try:
                    await template.start()
                except BaseException:
                    await template.aclose()
                    raise
                self._live[name] = template
        self._probe.pool_claimed(f"template:{name}", hit=hit, seconds=time.monotonic() - began)
        return template

    async def aclose(self) -> None:
        """Close every template's kernel (kernels made from them are closed by their owners)."""
        live, self._live = list(self._live.values()), {}
        for template in live:
            try:
                await template.aclose()
            except Exception:
                log.exception("closing a kernel template failed")
