"""LiteLLM's model API, as observed on 1.108.7 (docs/wire-formats.md, "LiteLLM's model API").

- list: `GET /v2/model/info?size=…&page=…` (default page size 50), every page;
- get one: `GET /v2/model/info?modelId=<id>`;
- create: `POST /model/new` with our `model_info.id`; a duplicate id answers an opaque 500, so a 500 is
  re-checked by id (present with our spec = done);
- update: `PATCH /model/<id>/update` with the full litellm_params and model_info, `model_info.id`
  included (without it the stored model_info gets a random id);
- delete: `POST /model/delete {"id"}`; 400 "not found" = already gone.
Rows are identified by `model_info.id` and our own `model_info` fields only: `litellm_params` values
can come back encrypted and `api_key` never comes back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import aiohttp

from fleetllm.adapters.http import HttpError, RetryPolicy, request_json
from fleetllm.core.fleet.jsonvalue import JSON, freeze_mapping
from fleetllm.core.judge.intended import DeploymentSpec
from fleetllm.core.judge.observed import Deployment
from fleetllm.core.secret import Secret
from fleetllm.errors import UpstreamError

PAGE_SIZE = 500
MAX_PAGES = 1000


class LitellmError(UpstreamError):
    """LiteLLM answered something we cannot use."""


class LitellmApi(Protocol):
    """What the planner's apply needs from LiteLLM; the HTTP client below and test fakes implement it."""

    async def list_deployments(self) -> tuple[Deployment, ...]: ...

    async def get(self, deployment_id: str) -> Deployment | None: ...

    async def create(self, spec: DeploymentSpec) -> None: ...

    async def update(self, spec: DeploymentSpec) -> None: ...

    async def delete(self, deployment_id: str) -> bool: ...  # False: it was already gone


def parse_deployment(item: JSON) -> Deployment | None:
    if not isinstance(item, dict):
        return None
    info = item.get("model_info")
    params = item.get("litellm_params")
    if not isinstance(info, dict) or not isinstance(ident := info.get("id"), str):
        return None
    api_base = params.get("api_base") if isinstance(params, dict) else None
    keep: dict[str, JSON] = {k: v for k, v in info.items() if v is not None}  # drop LiteLLM's ~150 null cost fields
    return Deployment(ident, str(item.get("model_name") or ""), freeze_mapping(keep),
                      api_base if isinstance(api_base, str) else None, info.get("db_model") is not False)


@dataclass
class LitellmClient:
    session: aiohttp.ClientSession
    url: str
    master_key: Secret  # revealed only into the Authorization header
    timeout_s: float = 30.0
    read_retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(attempts=3))
    page_size: int = PAGE_SIZE

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.master_key.reveal()}", "Accept": "application/json"}

    def _url(self, path: str) -> str:
        return self.url.rstrip("/") + path

    async def _page(self, params: dict[str, str]) -> tuple[list[Deployment], int]:
        _, body = await request_json(self.session, "GET", self._url("/v2/model/info"),
                                     what="LiteLLM GET /v2/model/info", headers=self._headers(), params=params,
                                     timeout_s=self.timeout_s,
                                     retry=self.read_retry)
        if not isinstance(body, dict) or not isinstance(data := body.get("data"), list):
            raise LitellmError("LiteLLM GET /v2/model/info: the answer has no `data` list")
        pages = body.get("total_pages")
        rows = [d for d in (parse_deployment(i) for i in data) if d is not None]
        return rows, pages if isinstance(pages, int) else 1

    async def list_deployments(self) -> tuple[Deployment, ...]:
        found: dict[str, Deployment] = {}
        page, pages = 1, 1
        while page <= pages:
            if page > MAX_PAGES:
                raise LitellmError(f"LiteLLM GET /v2/model/info: more than {MAX_PAGES} pages")
            rows, pages = await self._page({"size": str(self.page_size), "page": str(page)})
            for row in rows:
                found.setdefault(row.id, row)
            page += 1
        return tuple(found.values())

    async def get(self, deployment_id: str) -> Deployment | None:
        rows, _ = await self._page({"modelId": deployment_id})
        return next((r for r in rows if r.id == deployment_id), None)

    async def create(self, spec: DeploymentSpec) -> None:
        try:
            await request_json(self.session, "POST", self._url("/model/new"), what=f"LiteLLM create {spec.id}",
                               headers=self._headers(), body=spec.body(), timeout_s=self.timeout_s,
                               secrets=(str(spec.litellm_params.get("api_key", "")),))
        except HttpError as exc:
            if exc.status is None or exc.status >= 500:
                # An opaque 500 is what a duplicate id gives; a timeout may have been applied anyway.
                present = await self.get(spec.id)
                if present is not None and present.spec == spec.spec:
                    return
            raise LitellmError(str(exc)) from None

    async def update(self, spec: DeploymentSpec) -> None:
        try:
            await request_json(self.session, "PATCH", self._url(f"/model/{spec.id}/update"),
                               what=f"LiteLLM update {spec.id}", headers=self._headers(), body=spec.body(),
                               timeout_s=self.timeout_s, secrets=(str(spec.litellm_params.get("api_key", "")),))
        except HttpError as exc:
            raise LitellmError(str(exc)) from None

    async def delete(self, deployment_id: str) -> bool:
        try:
            await request_json(self.session, "POST", self._url("/model/delete"), what=f"LiteLLM delete {deployment_id}",
                               headers=self._headers(), body={"id": deployment_id}, timeout_s=self.timeout_s)
        except HttpError as exc:
            if exc.status in (400, 404) and "not found" in str(exc).lower():
                return False
            raise LitellmError(str(exc)) from None
        return True
