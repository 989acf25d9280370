"""A loopback stand-in for the Hugging Face Hub, speaking the part of its HTTP API that ``huggingface_hub`` uses here.

No Hub-compatible server from PyPI runs offline (``hf-local-hub`` ships only a CLI wrapper around a Go binary that is
not in its wheel or sdist; ``olah`` is a read-only mirror of the real Hub), so the registry tests point
``huggingface_hub`` at this server instead. It implements the requests that the installed ``huggingface_hub`` sends
for ``create_repo``, ``create_branch`` / ``delete_branch``, ``list_repo_refs``, ``upload_file`` (preupload + NDJSON
commit, direct or as a pull request), ``list_repo_files``, ``hf_hub_download`` (HEAD + GET on ``resolve``),
``delete_repo`` and collections; the answers follow the JSON shapes and ``X-Error-Code`` headers that the client
parses. Every request is recorded in :attr:`HubContractServer.requests`, so tests can assert the contract (private
repo creation, ``create_pr=1``, ...). Anything else gets a 404 saying it is not part of the recorded contract, which
makes a client upgrade that calls a new endpoint fail loudly rather than pass by accident.

Only "regular" (inline base64) uploads are taken: the preupload answer never asks for LFS.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from nemo_gym.config.ports import probe_free_port

INITIAL_FILES = {".gitattributes": b"*.jsonl filter=lfs diff=lfs merge=lfs -text\n"}


def _oid(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


@dataclass
class Repo:
    repo_id: str
    private: bool
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    """Commit oid -> the full file tree at that commit."""
    refs: dict[str, str] = field(default_factory=dict)
    """``refs/heads/<branch>``, ``refs/tags/<tag>`` and ``refs/pr/<n>`` -> commit oid."""

    def resolve(self, revision: str) -> str | None:
        for ref in (revision, f"refs/heads/{revision}", f"refs/tags/{revision}"):
            if ref in self.refs:
                return self.refs[ref]
        return revision if revision in self.commits else None

    def commit(self, parent: str, files: dict[str, bytes], summary: str) -> str:
        oid = _oid(json.dumps([parent, summary, sorted((k, _oid(v)) for k, v in files.items())]).encode())
        self.commits[oid] = files
        return oid


class ContractError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.extra = status, message, code, extra

    def response(self) -> Response:
        headers = {"X-Error-Message": self.message}
        if self.code:
            headers["X-Error-Code"] = self.code
        return JSONResponse({"error": self.message, **self.extra}, status_code=self.status, headers=headers)


class HubContractServer:
    """The fake Hub: in-memory repos and collections, one write token, every request recorded."""

    def __init__(self, token: str = "hf_contract_test_token") -> None:
        self.token = token
        self.repos: dict[str, Repo] = {}
        self.collections: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.app = FastAPI()
        self.app.add_api_route(
            "/{rest:path}", self._dispatch, methods=["GET", "HEAD", "POST", "PUT", "DELETE"], include_in_schema=False
        )
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- lifecycle ------------------------------------------------------------------------------------------------

    def start(self, timeout_s: float = 120.0) -> HubContractServer:  # a hang guard: returns once it is up
        self.port = probe_free_port()  # outside the ephemeral range, which outgoing connections take ports from
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="hub-contract-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the Hub contract server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    # -- test helpers ---------------------------------------------------------------------------------------------

    def add_collection(self, namespace: str, title: str, slug_suffix: str) -> str:
        slug = f"{namespace}/{'-'.join(title.lower().split())}-{slug_suffix}"
        self.collections[slug] = {
            "slug": slug,
            "title": title,
            "owner": {"name": namespace},
            "items": [],
            "lastUpdated": _now(),
            "position": 0,
            "private": True,
            "theme": "indigo",
            "upvotes": 0,
        }
        return slug

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        repo = self.repos[repo_id]
        return dict(repo.commits[repo.resolve(revision)])

    def calls(self, method: str, path_fragment: str) -> list[tuple[str, str, dict[str, str]]]:
        return [r for r in self.requests if r[0] == method and path_fragment in r[1]]

    # -- dispatch -------------------------------------------------------------------------------------------------

    async def _dispatch(self, request: Request, rest: str) -> Response:
        raw = request.scope.get("raw_path") or request.url.path.encode()
        segments = [unquote(s) for s in raw.decode().split("?")[0].strip("/").split("/")]
        self.requests.append((request.method, "/" + "/".join(segments), dict(request.query_params)))
        try:
            return await self._route(request, segments)
        except ContractError as e:
            return e.response()

    async def _route(self, request: Request, s: list[str]) -> Response:
        method = request.method
        if s[:2] == ["api", "repos"] and len(s) == 3:
            self._require_write(request)
            body = await request.json()
            if s[2] == "create" and method == "POST":
                return self._create_repo(body)
            if s[2] == "delete" and method == "DELETE":
                return self._delete_repo(body)
        if s[:2] == ["api", "datasets"] and len(s) >= 4:
            repo = self._repo(request, f"{s[2]}/{s[3]}")
            return await self._repo_api(request, repo, s[4:])
        if s[:1] == ["datasets"] and len(s) >= 6 and s[3] == "resolve" and method in ("GET", "HEAD"):
            repo = self._repo(request, f"{s[1]}/{s[2]}")
            return self._resolve(repo, s[4], "/".join(s[5:]), head=method == "HEAD")
        if s[:2] == ["api", "collections"] and len(s) >= 4:
            return await self._collections(request, f"{s[2]}/{s[3]}", s[4:])
        raise ContractError(404, f"{method} /{'/'.join(s)} is not part of the recorded Hub contract")

    def _require_write(self, request: Request) -> None:
        if request.headers.get("authorization") != f"Bearer {self.token}":
            raise ContractError(401, "Invalid credentials in Authorization header")

    def _repo(self, request: Request, repo_id: str) -> Repo:
        repo = self.repos.get(repo_id)
        authorized = request.headers.get("authorization") == f"Bearer {self.token}"
        if repo is None or (repo.private and not authorized):
            raise ContractError(401 if repo is not None else 404, "Repository not found", "RepoNotFound")
        return repo

    def _create_repo(self, body: dict[str, Any]) -> Response:
        if body.get("type") != "dataset":
            raise ContractError(400, "this contract server only holds dataset repos")
        repo_id = f"{body['organization']}/{body['name']}" if body.get("organization") else body["name"]
        url = f"{self.endpoint}/datasets/{repo_id}"
        if repo_id in self.repos:
            raise ContractError(409, "You already created this dataset repo", url=url)
        private = bool(body.get("private")) or body.get("visibility") == "private"
        repo = Repo(repo_id, private)
        repo.refs["refs/heads/main"] = repo.commit("", dict(INITIAL_FILES), "initial commit")
        self.repos[repo_id] = repo
        return JSONResponse({"url": url, "name": repo_id, "id": repo_id})

    def _delete_repo(self, body: dict[str, Any]) -> Response:
        repo_id = f"{body['organization']}/{body['name']}" if body.get("organization") else body["name"]
        if self.repos.pop(repo_id, None) is None:
            raise ContractError(404, "Repository not found", "RepoNotFound")
        return JSONResponse({})

    async def _repo_api(self, request: Request, repo: Repo, s: list[str]) -> Response:
        method = request.method
        if not s or (s[0] == "revision" and len(s) == 2):
            oid = self._revision(repo, s[1] if s else "main")
            siblings = [{"rfilename": name} for name in sorted(repo.commits[oid])]
            return JSONResponse({"id": repo.repo_id, "sha": oid, "private": repo.private, "siblings": siblings})
        if s[0] == "preupload" and method == "POST" and len(s) == 2:
            self._require_write(request)
            self._revision(repo, s[1])
            files = (await request.json())["files"]
            answer = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None} for f in files]
            return JSONResponse({"files": answer})
        if s[0] == "commit" and method == "POST" and len(s) == 2:
            self._require_write(request)
            return self._commit(repo, s[1], await request.body(), request.query_params.get("create_pr") == "1")
        if s[0] == "branch" and len(s) == 2:
            self._require_write(request)
            ref = f"refs/heads/{s[1]}"
            if method == "POST":
                if ref in repo.refs:
                    raise ContractError(409, f"Branch {s[1]} already exists")
                body = await request.json() if await request.body() else {}
                repo.refs[ref] = self._revision(repo, body.get("startingPoint") or "main")
                return JSONResponse({})
            if method == "DELETE":
                if ref not in repo.refs:
                    raise ContractError(404, f"Invalid rev id: {s[1]}", "RevisionNotFound")
                del repo.refs[ref]
                return JSONResponse({})
        if s[0] == "refs" and method == "GET" and len(s) == 1:
            return JSONResponse(self._refs(repo, request.query_params.get("include_prs") in ("1", "true", "True")))
        if s[0] == "tree" and method == "GET" and len(s) >= 2:
            files = repo.commits[self._revision(repo, s[1])]
            prefix = "/".join(s[2:])
            listed = [
                {"type": "file", "path": name, "size": len(data), "oid": _oid(data)}
                for name, data in sorted(files.items())
                if not prefix or name.startswith(prefix.rstrip("/") + "/")
            ]
            return JSONResponse(listed)
        raise ContractError(404, f"{method} {'/'.join(s)} on a dataset repo is not part of the recorded Hub contract")

    def _revision(self, repo: Repo, revision: str) -> str:
        oid = repo.resolve(revision)
        if oid is None:
            raise ContractError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return oid

    def _commit(self, repo: Repo, revision: str, payload: bytes, create_pr: bool) -> Response:
        parent = self._revision(repo, revision)
        if not create_pr and f"refs/heads/{revision}" not in repo.refs:
            raise ContractError(400, f"cannot commit to {revision!r}: not a branch")
        files = dict(repo.commits[parent])
        summary = ""
        for line in payload.splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            key, value = item["key"], item["value"]
            if key == "header":
                summary = value.get("summary", "")
            elif key == "file" and value.get("encoding") == "base64":
                files[value["path"]] = base64.b64decode(value["content"])
            elif key == "deletedFile":
                if files.pop(value["path"], None) is None:
                    raise ContractError(404, "A file with this name doesn't exist", "EntryNotFound")
            else:
                raise ContractError(400, f"commit operation {key!r} is not part of the recorded Hub contract")
        oid = repo.commit(parent, files, summary)
        url = f"{self.endpoint}/datasets/{repo.repo_id}/commit/{oid}"
        pr_url = None
        if create_pr:
            number = 1 + sum(1 for ref in repo.refs if ref.startswith("refs/pr/"))
            repo.refs[f"refs/pr/{number}"] = oid
            pr_url = f"{self.endpoint}/datasets/{repo.repo_id}/discussions/{number}"
        else:
            repo.refs[f"refs/heads/{revision}"] = oid
        return JSONResponse({"commitUrl": url, "commitOid": oid, "pullRequestUrl": pr_url, "success": True})

    @staticmethod
    def _refs(repo: Repo, include_prs: bool) -> dict[str, Any]:
        def of(prefix: str) -> list[dict[str, str]]:
            return [
                {"name": ref.removeprefix(prefix), "ref": ref, "targetCommit": oid}
                for ref, oid in sorted(repo.refs.items())
                if ref.startswith(prefix)
            ]

        answer: dict[str, Any] = {"branches": of("refs/heads/"), "converts": [], "tags": of("refs/tags/")}
        if include_prs:
            answer["pullRequests"] = [
                {"name": ref, "ref": ref, "targetCommit": oid} for ref, oid in repo.refs.items() if "/pr/" in ref
            ]
        return answer

    def _resolve(self, repo: Repo, revision: str, path: str, head: bool) -> Response:
        oid = self._revision(repo, revision)
        data = repo.commits[oid].get(path)
        if data is None:
            raise ContractError(404, "Entry not found", "EntryNotFound")
        headers = {"X-Repo-Commit": oid, "ETag": f'"{_oid(data)}"', "Content-Length": str(len(data))}
        return Response(content=b"" if head else data, headers=headers, media_type="application/octet-stream")

    async def _collections(self, request: Request, slug: str, s: list[str]) -> Response:
        collection = self.collections.get(slug)
        if collection is None:
            raise ContractError(404, "Collection not found")
        if not s and request.method == "GET":
            return JSONResponse(collection)
        if s == ["items"] and request.method == "POST":
            self._require_write(request)
            item = (await request.json())["item"]
            if any(existing["id"] == item["id"] for existing in collection["items"]):
                raise ContractError(409, "Item already in the collection")
            position = len(collection["items"])
            collection["items"].append(
                {"_id": _oid(item["id"].encode())[:24], "id": item["id"], "type": item["type"], "position": position}
            )
            collection["lastUpdated"] = _now()
            return JSONResponse(collection)
        raise ContractError(404, f"{request.method} collections/{slug}/{'/'.join(s)} is not part of the contract")
